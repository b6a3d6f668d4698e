"""``cconv doctor``: does every training step lower for CUDA, ROCm and TPU?  Checked without a device.

``jax.export.export(step, platforms=(p,))`` lowers a jitted function for a platform that is not
present (StableHLO, no XLA compile).  For every registered compressor (its entry's ``example``;
with ``full``, also each switch of its schema flipped: ``settings``),
memory (``cconv.memory.MEMORIES``), architecture (``cconv.comm.aggregation.TRANSPORTS``),
aggregation option (``collective`` in ``COLLECTIVES``, majority ``vote``) and launcher
(``cconv.engine.launchers.LAUNCHERS``) that the engine accepts, the doctor builds the training
step of a small MLP on ``WORKERS`` workers, exports it for each platform and checks that

1. it lowers;
2. the module calls no CPU-only custom call (cconv's native top-k kernel,
   ``cconv._native.TOPK_TARGET``, or a CPU library call such as LAPACK's): on other platforms
   ``cconv.compressors.select`` picks ``lax.top_k`` at trace time (``lax.platform_dependent``);
3. the collectives of the module (``cconv.comm.hlo.stablehlo_collectives``), with the ring
   formulas, move exactly the bytes per device that cconv logs (``Trainer.traffic``, control
   traffic included): the same proof as the CPU's compiled-HLO check.  A one-device launcher
   (vmap) must have no collective at all: vmap turns them into local reductions.

What this does not prove: that XLA *compiles* the module for the platform (the GPU/TPU compiler
passes run only on such a machine), nor speed or numerics there.  A launcher that jax.export
cannot export (pmap, whose per-device program is not a jit) and one the engine refuses here (mpi
without mpirun) are listed with their reason, as is every combination the engine refuses.

The default set (``quick``, the CI test) is every compressor's example with every memory on
all-to-all / shard_map, every compressor on vmap, the first compressor of each aggregation
method on the parameter server, every valid ``collective``/``vote`` option, and the other
launchers once; ``full=True`` (``cconv doctor --full``, the extended test) is the whole product.
The step is traced once per combination and lowered once per platform (the trace is cached).

Multi-platform exports (``platforms=("cpu", "cuda")``) need
``jax.export.DisabledSafetyCheck.custom_call(cconv._native.TOPK_TARGET)`` when the native
kernel is built: the kernel then sits in the CPU branch of ``lax.platform_dependent`` only
(tested in ``tests/test_select.py``); the doctor exports one platform at a time, as a job runs.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections import Counter
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cconv import _native
from cconv import compressors as C
from cconv import memory as M
from cconv._startup import configure_devices
from cconv.cli_schema import Command, Option
from cconv.comm import hlo
from cconv.comm.aggregation import COLLECTIVES, TRANSPORTS, method_of
from cconv.engine import EngineConfig, build
from cconv.engine.config import ENGINE_DEFAULTS
from cconv.engine.launchers import LAUNCHERS
from cconv.experiments import io

PLATFORMS = ("cuda", "rocm", "tpu")
WORKERS = 4
BATCH = 32
DEFAULT_LAUNCHER = ENGINE_DEFAULTS["launcher"]
ONE_DEVICE = next(n for n, cls in LAUNCHERS.items() if cls.one_device)
# Custom-call targets that exist only on the CPU: cconv's own kernel, then jax's CPU libraries.
CPU_ONLY_TARGETS = (_native.TOPK_TARGET,)
CPU_ONLY_PATTERN = re.compile(r"^(lapack_|ducc_|xla_(ffi_)?python_cpu_callback)|_cpu$|^cpu_")
_CUSTOM_CALL = re.compile(r'custom_call\s*@([\w.$\-]+)|call_target_name\s*=\s*"([^"]+)"')


# ----------------------------------------------------------------------------- the tiny problem


def _loss(params, model_state, batch, key):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    loss = jnp.mean(((h @ params["w2"])[:, 0] - batch["y"]) ** 2)
    return loss, ({"mean": 0.9 * model_state["mean"] + 0.1 * batch["x"].mean(0)}, {})


def _problem(din: int = 6, hidden: int = 16):
    """(params, model_state, abstract batch, abstract key): a matrix PowerSGD compresses, a bias
    and a thin matrix (so the size filters have something to do), a model state."""
    params = {
        "w1": jnp.zeros((din, hidden), jnp.float32),
        "b1": jnp.zeros((hidden,), jnp.float32),
        "w2": jnp.zeros((hidden, 1), jnp.float32),
    }
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    return params, {"mean": jnp.zeros((din,))}, {"x": f32(BATCH, din), "y": f32(BATCH)}, key


# ----------------------------------------------------------------------------- combinations


class Combo(NamedTuple):
    """One training-step configuration the doctor exports."""

    compressor: str
    hparams: tuple  # ((name, value), ...) of the setting (``settings``)
    memory: str = ENGINE_DEFAULTS["memory"]  # the engine's settings default to the engine's
    architecture: str = ENGINE_DEFAULTS["architecture"]
    collective: str = ENGINE_DEFAULTS["collective"]
    vote: bool = ENGINE_DEFAULTS["vote"]
    launcher: str = DEFAULT_LAUNCHER

    @property
    def row(self) -> str:
        """The table row: compressor and its options."""
        return " ".join([self.compressor, *(f"{k}={v}" for k, v in self.hparams)])

    @property
    def label(self) -> str:
        extra = [f"memory={self.memory}", self.architecture, f"collective={self.collective}"]
        return " ".join([self.row, *extra, *(["vote"] if self.vote else []), f"launcher={self.launcher}"])

    def config(self) -> EngineConfig:
        return EngineConfig(
            workers=WORKERS,
            compressor=C.get(self.compressor, **dict(self.hparams)),
            memory=self.memory,
            architecture=self.architecture,
            collective=self.collective,
            vote=self.vote,
            launcher=self.launcher,
        )


_OPTIONS = [("auto", False), *((c, False) for c in COLLECTIVES if c != "auto"), ("auto", True)]


def _full(name: str, hp: tuple) -> list[Combo]:
    return [
        Combo(name, hp, mem, arch, coll, vote, launcher)
        for mem in M.MEMORIES
        for arch in TRANSPORTS
        for coll, vote in _OPTIONS
        for launcher in LAUNCHERS
    ]


def _quick(name: str, hp: tuple, first_of_method: bool) -> list[Combo]:
    out = [Combo(name, hp, mem) for mem in M.MEMORIES]
    out += [Combo(name, hp, collective=coll, vote=vote) for coll, vote in _OPTIONS[1:]]
    out.append(Combo(name, hp, launcher=ONE_DEVICE))
    if first_of_method:
        out.append(Combo(name, hp, architecture="parameter-server"))
    return out


def settings(e: C.Entry) -> list[dict]:
    """The entry's example, then its example with each switch of its schema flipped, one at a time
    (every other choice of a "str" hyper-parameter, the other value of a "bool" one; those that do
    not build are left out): the settings that change the program, read from the schema."""
    example = dict(e.example)
    out = [example]
    for p in e.schema.params:
        values = (p.choices or ()) if p.type == "str" else (True, False) if p.type == "bool" else ()
        for v in values:
            hp = {**example, p.name: v}
            if v == e.schema.validate(e.name, example).get(p.name) or hp in out:
                continue
            try:
                e.schema.validate(e.name, hp)
            except ValueError:
                continue
            out.append(hp)
    return out


def combos(full: bool = False) -> list[Combo]:
    """The combinations to check (module docstring): ``quick`` by default, all with ``full``."""
    out, methods = [], set()
    for e in C.entries():
        for case in settings(e) if full else [dict(e.example)]:
            hp = tuple(sorted(case.items()))
            if full:
                out += _full(e.name, hp)
                continue
            method = method_of(C.get(e.name, **case))
            out += _quick(e.name, hp, method not in methods)
            methods.add(method)
    if not full:  # the other launchers, once each
        first = C.entries()[0]
        hp = tuple(sorted(first.example.items()))
        out += [Combo(first.name, hp, launcher=n) for n in LAUNCHERS if n not in (DEFAULT_LAUNCHER, ONE_DEVICE)]
    return out


# ----------------------------------------------------------------------------- the check


class Result(NamedTuple):
    """One combination on one platform.  status: "lowers" | "fails" (a valid combination that
    does not lower, or lowers wrongly) | "refused" (the engine refuses the combination on every
    platform) | "not exported" (jax.export cannot export this launcher's program)."""

    combo: Combo
    platform: str
    status: str
    reason: str = ""
    collectives: int = 0
    bytes_sent: float = 0.0  # per device, rank 0 (the module's collectives)


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return re.sub(r" at 0x[0-9a-f]+", "", f"{type(e).__name__}: {msg[0] if msg else ''}")[:200]


def custom_calls(mlir_text: str) -> list[str]:
    """The custom-call targets a StableHLO module calls (sorted, distinct)."""
    return sorted({a or b for a, b in _CUSTOM_CALL.findall(mlir_text)})


def cpu_only_calls(mlir_text: str) -> list[str]:
    """The module's custom-call targets that exist only on the CPU (``CPU_ONLY_TARGETS`` and jax's
    CPU library calls, ``CPU_ONLY_PATTERN``)."""
    return [t for t in custom_calls(mlir_text) if t in CPU_ONLY_TARGETS or CPU_ONLY_PATTERN.search(t)]


def _verdict(tr, exported, one_device: bool) -> tuple[str, str, int, float]:
    """(status, reason, collectives, bytes sent by rank 0) of one exported module."""
    text = exported.mlir_module()
    bad = cpu_only_calls(text)
    if bad:
        return "fails", f"calls the CPU-only custom call {', '.join(bad)}", 0, 0.0
    found = hlo.stablehlo_collectives(text)
    if one_device:
        if found:
            return "fails", f"{len(found)} collectives in a one-device program", len(found), 0.0
        return "lowers", "", 0, 0.0
    try:
        sent, recv = hlo.traffic(found, WORKERS)
    except ValueError as e:
        return "fails", _first_line(e), len(found), 0.0
    want_sent, want_recv = tr.traffic(0, control=True)
    if not (np.allclose(sent, want_sent, rtol=1e-9, atol=1e-9) and np.allclose(recv, want_recv, rtol=1e-9, atol=1e-9)):
        return "fails", f"module moves {sent.tolist()} B per device, cconv logs {list(want_sent)}", len(found), sent[0]
    return "lowers", "", len(found), float(sent[0])


def check(combo: Combo, platforms=PLATFORMS) -> list[Result]:
    """Export ``combo``'s first training step for each platform and check it (module docstring)."""
    params, mstate, batch, key = _problem()
    try:
        engine_cfg = combo.config()
        tr = build(_loss, params, optax.sgd(0.1), engine_cfg, model_state=mstate, devices=jax.devices("cpu"))
    except (ValueError, ImportError) as e:
        return [Result(combo, p, "refused", _first_line(e)) for p in platforms]
    state = jax.eval_shape(tr.init)
    out = []
    for p in platforms:
        try:
            exported = tr.export(state, batch, key, (p,))
        except Exception as e:  # noqa: BLE001 - the doctor reports why a step does not lower
            jit_only = "must be the result of `jit`" in str(e)
            out.append(Result(combo, p, "not exported" if jit_only else "fails", _first_line(e)))
            continue
        out.append(Result(combo, p, *_verdict(tr, exported, LAUNCHERS[combo.launcher].one_device)))
    return out


def run_checks(platforms=PLATFORMS, full: bool = False) -> list[Result]:
    """``check`` over ``combos(full)``."""
    if len(jax.devices("cpu")) < WORKERS:
        raise ValueError(
            f"cconv doctor needs {WORKERS} CPU devices: set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{WORKERS} before jax starts (the cconv CLI does)"
        )
    return [r for combo in combos(full) for r in check(combo, platforms)]


# ----------------------------------------------------------------------------- the table


def _cell(results: list[Result]) -> str:
    checked = [r for r in results if r.status in ("lowers", "fails")]
    failed = [r for r in checked if r.status == "fails"]
    if failed:
        return f"{len(failed)}/{len(checked)} fail: {failed[0].reason}"
    if checked:
        return f"lowers ({len(checked)})"
    return ", ".join(f"{status} ({n})" for status, n in Counter(r.status for r in results).items()) or "-"


def table(results: list[Result]) -> str:
    """Rows: compressors (with options); columns: platforms; cells: "lowers (n combinations)" or
    the reason the first failing one does not; then, each as a table with the reason in a column,
    the failures, the combinations that could not be exported and those the engine refuses."""
    platforms = list(dict.fromkeys(r.platform for r in results))
    rows = list(dict.fromkeys(r.combo.row for r in results))
    by = lambda row, p: [r for r in results if r.combo.row == row and r.platform == p]
    cells = {(row, p): _cell(by(row, p)) for row in rows for p in platforms}
    out = _columns(["compressor (options)", *platforms], [[row, *(cells[row, p] for p in platforms)] for row in rows])
    sections = (
        ("fails", "Failures: valid combinations that do not lower, or lower wrongly ({})"),
        ("not exported", "Not exported: jax.export cannot export this launcher's program ({})"),
        ("refused", "Refused by the engine on every platform ({}; not failures: the engine rejects them)"),
    )
    for status, title in sections:
        picked = [r for r in results if r.status == status]
        if picked:
            out += ["", title.format(_n(len({r.combo for r in picked}), "combination")) + ":", ""]
            out += _reasons(picked, per_platform=status == "fails")
    return "\n".join(out)


def _columns(header: list[str], body: list[list[str]]) -> list[str]:
    """A plain-text table: the header, a rule, the rows; every column padded to its widest cell."""
    widths = [max(len(c) for c in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in body)]


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _plain(reason: str) -> str:
    """A reason as a sentence: the compressor's name and the exception's class taken out."""
    return re.sub(r"^(ValueError|ImportError): ", "", re.sub(r",? got '[^']*'", "", reason))


def _reasons(picked: list[Result], per_platform: bool) -> list[str]:
    """One row per reason: how many combinations, the compressors concerned, the reason (and the
    platform, for failures); one full combination per reason in the JSON (``--json``)."""
    groups: dict[tuple, list[Result]] = {}
    for r in picked:
        groups.setdefault((_plain(r.reason), r.platform if per_platform else ""), []).append(r)
    body = []
    for (reason, plat), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        combos = list(dict.fromkeys(r.combo for r in rs))
        names = list(dict.fromkeys(c.compressor for c in combos))
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        body.append([*([plat] if per_platform else []), str(len(combos)), shown, reason])
    return _columns([*(["platform"] if per_platform else []), "n", "compressors", "reason"], body)


def summary(results: list[Result]) -> dict:
    """Counts per status (what the CLI's JSON and the tests read)."""
    return dict(Counter(r.status for r in results))


def summary_words(results: list[Result], platforms) -> str:
    """The verdict in one or two sentences (the last lines ``cconv doctor`` prints)."""
    combos = lambda status: {r.combo for r in results if r.status == status}
    checked = {r.combo for r in results if r.status in ("lowers", "fails")}
    failed, refused, skipped = combos("fails"), combos("refused"), combos("not exported")
    where = ", ".join(platforms[:-1]) + (" and " if len(platforms) > 1 else "") + platforms[-1]
    if failed:
        head = f"{len(failed)} of the {_n(len(checked), 'valid combination')} fail on {where} (listed above)."
    else:
        head = f"All {len(checked)} valid combinations lower for {where}, with the bytes cconv logs."
        head = head.replace("All 1 valid combinations lower", "The 1 valid combination lowers")
    rest = [f"{_n(len(refused), 'combination')} refused by the engine"] if refused else []
    rest += [f"{_n(len(skipped), 'combination')} that jax.export cannot export"] if skipped else []
    return head + (f" Not checked, with their reasons above: {' and '.join(rest)}." if rest else "")


# ----------------------------------------------------------------------------- CLI


def run(args: argparse.Namespace) -> int:
    """``cconv doctor``: print the table; exit 1 when a valid combination does not lower."""
    if args.json:  # refused before the checks run (minutes), never followed if a link (cconv.experiments.io)
        io.check_output(args.json, "--json", in_results=False)
    configure_devices(WORKERS)
    platforms = PLATFORMS if args.platform == "all" else (args.platform,)
    t0 = time.perf_counter()
    results = run_checks(platforms, full=args.full)
    print(f"cconv doctor: the training step exported with jax.export for {', '.join(platforms)}")
    print(f"(lowered, not compiled; jax {jax.__version__}, {WORKERS} workers)")
    print("cells: how many combinations lower, or why the first that fails does not\n")
    print(table(results))
    print(f"\n{summary_words(results, platforms)} ({time.perf_counter() - t0:.0f} s)")
    if args.json:
        rows = [{**r._asdict(), "combo": {**r.combo._asdict(), "hparams": dict(r.combo.hparams)}} for r in results]
        io.check_writable(os.path.dirname(os.path.abspath(args.json)))  # its directory, made if missing
        io.write_json(args.json, rows)
    return 1 if any(r.status == "fails" for r in results) else 0


COMMAND = Command(
    "doctor",
    help="check that every training step lowers for CUDA, ROCm and TPU (no device needed)",
    description=__doc__.split("\n\n")[0],
    options=(
        Option("--platform", choices=(*PLATFORMS, "all"), default="all", help="platform to lower for (default all)"),
        Option("--full", action="store_true", help="every setting x memory x architecture x option x launcher"),
        Option("--json", metavar="FILE", help="also write every result as JSON"),
    ),
    handler=run,
)
