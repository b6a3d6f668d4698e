#!/usr/bin/env bash
# Build the documentation site with warnings as errors: docs/_build/html/index.html.
# Needs the docs extra (pip install -e ".[docs]"; `bash scripts/setup.sh ci` installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
"$PY" -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "docs: docs/_build/html/index.html"
