"""The documentation site: every ```python block of docs/*.md runs as printed, the site builds with
Sphinx warnings as errors, and its pages render in headless Chromium with images and internal links.

Why extraction and ``exec`` rather than Sphinx's doctest: the pages hold copy-paste programs (no
``>>>`` prompts), and a page's blocks build on each other as a reader runs them, so each page's
blocks run in order in one namespace, in this process (the 8 simulated devices of conftest).
"""

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
import registry_cases as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# pages whose blocks another test runs, in full, with checks of its own (64 of the 200 steps)
RUN_ELSEWHERE = {
    "engine.md": "tests/test_engine_readme.py",
    "dropin.md": "tests/test_dropin.py::test_docs_dropin_example_runs_and_moves_the_engines_bytes",
}


def python_blocks(path: str) -> list[str]:
    return FENCE.findall(open(path, encoding="utf-8").read())


def pages_with_code():
    out = []
    for path in sorted(glob.glob(os.path.join(DOCS, "*.md"))):
        name = os.path.basename(path)
        if python_blocks(path) and name not in RUN_ELSEWHERE:
            out.append(pytest.param(path, id=name))
    return out


def test_extraction_finds_the_blocks_of_the_guide():
    found = {os.path.basename(p.values[0]) for p in pages_with_code()}
    assert {"concepts.md", "compressors.md", "planner.md"} <= found
    for name, test in RUN_ELSEWHERE.items():
        assert python_blocks(os.path.join(DOCS, name)) and os.path.exists(os.path.join(ROOT, test.split("::")[0]))
    assert not any("```python" in b for p in pages_with_code() for b in python_blocks(p.values[0]))


@pytest.mark.parametrize("path", pages_with_code())
def test_python_blocks_run_as_printed(path, capsys):
    ns = {"__name__": "docs"}
    with R.registries_restored():  # what a page registers (a schedule, a compressor) stays on the page
        for i, block in enumerate(python_blocks(path)):
            exec(compile(block, f"{os.path.basename(path)}[block {i}]", "exec"), ns)
    capsys.readouterr()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with -W (every Sphinx warning an error) into a temporary directory."""
    out = tmp_path_factory.mktemp("html")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return str(out)


# The site's build with -W and its browser check run in CI once, after the suite (.ci/run:
# scripts/docs.sh, then scripts/check_docs_site.py on every page), so these two are in the
# extended tier: in the suite they built the whole site a second time (8 s on a quiet machine, 30 s at
# load 34).  The generated table's content is checked in the fast tier, below, from its generator.
@pytest.mark.extended
def test_site_builds_without_warnings_and_has_the_generated_table(site):
    import cconv

    html = open(os.path.join(site, "compressors.html"), encoding="utf-8").read()
    for name in cconv.compressors.names():  # one row per registered compressor, from the registry
        assert f"<p>{name}" in html, name
    assert os.path.exists(os.path.join(site, "api.html")) and "Exchange" in open(os.path.join(site, "api.html")).read()


@pytest.mark.extended
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="Debian's chromium is not installed (bash scripts/setup.sh ci installs it)"
)
def test_pages_render_in_chromium_with_images_and_links(site):
    pytest.importorskip("playwright", reason="the docs extra is not installed")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import check_docs_site

    assert check_docs_site.main([site, "--pages", "index.html", "dropin.html"]) == 0


def test_the_generated_compressor_table_has_one_row_per_registered_compressor():
    """``{compressor-table}`` (docs/_ext/compressor_table.py) reads the registry: one row per entry,
    each with its class, constant, bits per element, paper and wire format filled in."""
    compressor_table = _load("compressor_table", os.path.join(DOCS, "_ext", "compressor_table.py"))
    import cconv

    rows = compressor_table.rows()
    assert [r[0].split(" (")[0] for r in rows] == list(cconv.compressors.names())
    assert all(len(r) == len(compressor_table.COLUMNS) and all(c.strip() for c in r) for r in rows), rows


def _load(name: str, path: str):
    """The module in the file ``path`` (a script or Sphinx extension outside any package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


README = os.path.join(ROOT, "README.md")


def test_readme_is_short_runs_as_printed_and_links_to_pages_that_exist(capsys):
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 200
    (block,) = FENCE.findall(text)  # the drop-in example
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    assert "56.0 B sent per worker per step" in capsys.readouterr().out  # top-k of 32 entries: k = 1, 8 B, 7 peers
    links = re.findall(r"\]\(((?:docs|theory|paper_figures)/[^)#]+)\)", text)
    assert len(links) >= 13 and all(os.path.exists(os.path.join(ROOT, p)) for p in links), links
    assert "<!-- BEGIN quickstart-main -->" in text and "<!-- END quickstart-main -->" in text


def test_every_compressor_factory_has_help_with_its_formula_knobs_and_defaults():
    """help(cconv.compressors.<name>) gives the module's text (formula, paper, bytes) and the knobs,
    defaults and aggregation read from the registry entry (before: the private factory's docstring)."""
    import pydoc

    import cconv

    for name in cconv.compressors.names():
        factory = getattr(cconv.compressors, name)
        entry = cconv.compressors.entry(name)
        text = pydoc.render_doc(factory, renderer=pydoc.plaintext)
        first = sys.modules[entry.factory.__module__].__doc__.strip().splitlines()[0]
        assert first in text and "Hyper-parameters" in text, name
        for p in entry.schema.params:
            assert f"{p.name}={p.default!r}: {p.describe()}" in text, (name, p.name)
        assert "Aggregation:" in text, name
    assert "A tie" in cconv.compressors.signsgd.__doc__ and "resolves to +1" in cconv.compressors.signsgd.__doc__


TEST_REF = re.compile(r"tests/(test_\w+\.py)::(test_\w+)")


def test_every_test_a_page_names_exists():
    """The promises in the docs ("What cconv guarantees", config rules, signals, ...) name their
    tests as ``tests/<file>::<test>``; each named test must exist, so a renamed or removed test
    cannot leave a promise pointing at nothing."""
    named = set()
    for page in glob.glob(os.path.join(DOCS, "*.md")) + [README]:
        named |= {(page, f, t) for f, t in TEST_REF.findall(open(page, encoding="utf-8").read())}
    assert len(named) >= 20
    missing = []
    for page, f, t in sorted(named):
        path = os.path.join(ROOT, "tests", f)
        if not os.path.exists(path) or not re.search(rf"^def {t}\(", open(path, encoding="utf-8").read(), re.M):
            missing.append(f"{os.path.basename(page)}: tests/{f}::{t}")
    assert not missing, missing


def test_readme_advise_table_is_the_committed_validation():
    """The README's table of the advisor's validation is made from studies/advise/results.json
    (``python studies/advise/readme.py`` prints it)."""
    mod = _load("advise_readme", os.path.join(ROOT, "studies/advise/readme.py"))
    text = open(README, encoding="utf-8").read()
    block = text.split("<!-- BEGIN advise-validation -->\n")[1].split("\n<!-- END advise-validation -->")[0]
    assert block == mod.table(mod.load())


def test_cluster_validation_table_is_made_from_its_data():
    """studies/advise/clusters/results.md (included in docs/advise_validation.md) is what ``clusters.py`` makes
    of the committed results.json: the tables of the advice on other clusters are the data's."""
    mod = _load("advise_clusters", os.path.join(ROOT, "studies/advise/clusters.py"))
    d = os.path.join(ROOT, "studies/advise/clusters")
    committed = open(os.path.join(d, "results.md"), encoding="utf-8").read()
    assert committed == mod.markdown(mod.load(os.path.join(d, "results.json")))
    assert "| 8x1 1GbE | mnist1d |" in committed and "| exp |" in committed


def _setup_plan(*target: str) -> str:
    """What ``scripts/setup.sh TARGET`` would install (its dry run: nothing is installed)."""
    assert "CCONV_SETUP_DRY_RUN" in open(os.path.join(ROOT, "scripts", "setup.sh"), encoding="utf-8").read()
    env = {**os.environ, "CCONV_SETUP_DRY_RUN": "1"}
    r = subprocess.run(["bash", "scripts/setup.sh", *target], cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_command_one_installs_the_main_job_only_and_ci_installs_the_browser():
    """README command 1 (``bash scripts/setup.sh``) installs cconv and matplotlib, not the test tools,
    the docs toolchain, OpenMPI or the browser; ``setup.sh tests`` adds what the suite needs; ``.ci/run``
    (``setup.sh ci``) adds the docs toolchain and chromium.  README, docs/getting_started.md and
    .ci/run name the same two commands."""
    assert _setup_plan() == "extras: plots"
    tests = _setup_plan("tests")
    assert "dev" in tests.split("; ")[0].split(",") and "openmpi" in tests
    assert "docs" not in tests and "chromium" not in tests
    ci = _setup_plan("ci")
    assert "docs" in ci.split("; ")[0].split(",") and "chromium" in ci
    readme = open(README, encoding="utf-8").read()
    commands = re.findall(r"^```bash\n(bash scripts/setup.sh[^\n]*)\n```", readme, re.M)
    assert commands == [
        "bash scripts/setup.sh && .venv/bin/cconv sweep studies/quickstart.yaml",
        'bash scripts/setup.sh tests && .venv/bin/python -m pytest -q -n 2 -m "not extended"',
    ]
    for page in ("getting_started.md", "index.md"):  # the guide and the site's landing page
        guide = open(os.path.join(DOCS, page), encoding="utf-8").read()
        assert re.findall(r"^```bash\n(bash scripts/setup.sh[^\n]*)\n```", guide, re.M) == commands, page
    ci_lines = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().splitlines()
    assert "bash scripts/setup.sh ci" in ci_lines and commands[1] in ci_lines
    r = subprocess.run(["bash", "scripts/setup.sh", "docs"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown target 'docs'" in r.stderr
