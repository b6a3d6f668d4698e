"""Sphinx configuration of cconv's documentation site (MyST markdown, sphinx-book-theme).

Build: ``.venv/bin/sphinx-build -W -b html docs docs/_build/html`` (``scripts/docs.sh``).
The compressor table is generated from the registry at build time (``_ext/compressor_table.py``).
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))
# the API reference imports cconv (and jax): CPU only, no accelerator probing while building
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "cconv"
author = "the cconv authors"
copyright = "2026, the cconv authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx_copybutton",
    "compressor_table",
    "plain_docstrings",
]
source_suffix = {".md": "markdown"}
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
suppress_warnings = ["myst.header"]  # pages moved from the README start at level 2 in places

autosummary_generate = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures stay readable; the docstrings say the types
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "sphinx_book_theme"
html_title = "cconv"
html_static_path = ["_static"]
html_theme_options = {"show_toc_level": 2}
html_css_files = ["cconv.css"]  # wide content and code, full-width figures (docs/_static/cconv.css)
# One search box: the header's search button stays; the sidebar's duplicate field is left out.
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]}

# Copy buttons on code blocks; a console block's "$ " prompts and its output lines are not copied.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True

# Pages written on other branches: listed in the guide's table of contents when present, so the
# site builds with or without them (index.md's OPTIONAL_PAGES line).
OPTIONAL_PAGES = [
    "guarantees",
    "signals",
    "config_rules",
    "gpu",
    "clusters",
    "advise",
    "advise_validation",
    "extending",
]


def _optional_pages(app, docname, source):
    if docname == "index":
        here = os.path.dirname(__file__)
        present = [p for p in OPTIONAL_PAGES if os.path.exists(os.path.join(here, p + ".md"))]
        source[0] = source[0].replace("OPTIONAL_PAGES\n", "".join(p + "\n" for p in present))


def setup(app):
    app.connect("source-read", _optional_pages)
