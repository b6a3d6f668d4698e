"""A byte-level language-modelling corpus that is on every machine: CPython's own standard library.

Which text
    The source of 24 pure-Python standard-library modules (``STDLIB_MODULES``: argparse, difflib,
    inspect, typing, ...) read from ``sysconfig.get_paths()["stdlib"]`` of the running interpreter,
    in that fixed (sorted) order, concatenated and capped at ``max_bytes`` (default 1 MiB; the 24
    files are about 0.9 MB on CPython 3.11).  With ``docstrings_only=True`` only the docstrings
    (module, class, function; extracted with ``ast``) are kept: English prose instead of code.
    ``this.py`` (ROT13) and generated or platform-specific modules are deliberately absent.

Why it is legitimate and always available
    CPython is distributed under the PSF License Agreement (version 2), which grants "a
    nonexclusive, royalty-free, world-wide license to reproduce, analyze, test, perform and/or
    display publicly, prepare derivative works, distribute, and otherwise use Python"; training
    a model on it is such a use.  The files ship with every CPython installation that can run
    cconv, so nothing is downloaded.  The text depends on the Python version: ``info`` records
    the version, the files used and the corpus SHA-256, so a result can be tied to its corpus.
    A missing stdlib source (some minimal images strip ``.py`` files) is a ValueError.

    ``root=DIR`` replaces the corpus by the ``*.txt`` files directly in DIR (sorted by name).

Tokens and examples
    Byte-level: a token is one byte (vocabulary 256, ``num_classes = 256``), so no tokenizer is
    needed and every text is representable.  The last ``test_fraction`` of the byte stream is the
    test split (contiguous, so no test window overlaps training text).  Each split is cut into
    windows with stride ``seq_len``: ``x[i] = t[i T : i T + T]``, ``y[i] = t[i T + 1 : i T + T + 1]``
    (int32 [N, T] each): ``y`` holds the next token of every position of ``x``.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import sysconfig
from pathlib import Path

import numpy as np

from cconv.data.base import Dataset
from cconv.data.embedded import _check_float, _check_int

STDLIB_MODULES = (
    "abc",
    "argparse",
    "bisect",
    "calendar",
    "colorsys",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "difflib",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "inspect",
    "numbers",
    "operator",
    "pprint",
    "random",
    "shlex",
    "statistics",
    "string",
    "textwrap",
    "typing",
)
VOCAB = 256


def _docstrings(source: str) -> str:
    """Module, class and function docstrings of a Python source, in source order."""
    tree = ast.parse(source)
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    docs = [ast.get_docstring(n, clean=True) for n in nodes]
    return "".join(d + "\n\n" for d in docs if d)


def corpus_files(root=None) -> list[Path]:
    """The files the corpus is read from, in order (see the module docstring)."""
    if root is not None:
        base = Path(root).expanduser()
        if not base.is_dir():
            raise ValueError(f"text: corpus directory {base} not found (expected *.txt files there)")
        files = sorted(p for p in base.iterdir() if p.suffix == ".txt" and p.is_file())
        if not files:
            raise ValueError(f"text: no *.txt files in {base}")
        return files
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / f"{m}.py" for m in STDLIB_MODULES]
    present = [f for f in files if f.is_file()]
    if not present:
        raise ValueError(
            f"text: the standard-library sources ({STDLIB_MODULES[0]}.py, ...) are not "
            f"in {stdlib}; pass root=DIR with *.txt files"
        )
    return present


def _read_prefix(path: Path, chars: int | None) -> str:
    """The first ``chars`` characters of a UTF-8 text file (all of it when None), as ``read_text``
    reads them (universal newlines): a character is at least one byte of the corpus, so ``chars``
    characters cover ``chars`` corpus bytes, and at most 4 x ``chars`` bytes of the file are read
    (a 1.5 GB file gives its first MiB, not 1.5 GB in memory)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(-1 if chars is None else max(chars, 0))
    except UnicodeDecodeError as e:
        raise ValueError(f"text: {path} is not UTF-8 text ({e.reason})") from None


def corpus_bytes(root=None, max_bytes: int = 1 << 20, docstrings_only: bool = False):
    """(bytes, files) of the corpus, capped at ``max_bytes``."""
    files = corpus_files(root)
    chunks, total = [], 0
    for f in files:
        text = _read_prefix(f, None if docstrings_only and f.suffix == ".py" else max_bytes - total)
        if docstrings_only and f.suffix == ".py":
            text = _docstrings(text)
        data = text.encode("utf-8")
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes], files[: len(chunks)]


def _windows(tokens: np.ndarray, seq_len: int):
    n = (len(tokens) - 1) // seq_len
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len)[None, :]
    return tokens[idx].astype(np.int32), tokens[idx + 1].astype(np.int32)


def text(
    root=None, seq_len: int = 64, max_bytes: int = 1 << 20, test_fraction: float = 0.1, docstrings_only: bool = False
) -> Dataset:
    """Byte-level LM data from CPython's standard library (module docstring)."""
    seq_len = _check_int("seq_len", seq_len, 1)
    max_bytes = _check_int("max_bytes", max_bytes, 2 * (seq_len + 1))
    test_fraction = _check_float("test_fraction", test_fraction, 0.0, strict=True)
    if test_fraction >= 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    data, files = corpus_bytes(root, max_bytes, docstrings_only)
    tokens = np.frombuffer(data, np.uint8)
    n_test = int(round(len(tokens) * test_fraction))
    train_tok, test_tok = tokens[: len(tokens) - n_test], tokens[len(tokens) - n_test :]
    if len(train_tok) <= seq_len or len(test_tok) <= seq_len:
        raise ValueError(
            f"text: corpus of {len(tokens)} bytes is too small for seq_len={seq_len} and test_fraction={test_fraction}"
        )
    xtr, ytr = _windows(train_tok, seq_len)
    xte, yte = _windows(test_tok, seq_len)
    info = {
        "name": "text",
        "tokenizer": "bytes (vocabulary 256)",
        "source": "CPython standard library (PSF License v2)" if root is None else str(root),
        "python": platform.python_version(),
        "files": [str(f) for f in files],
        "bytes": len(tokens),
        "sha256": hashlib.sha256(data).hexdigest(),
        "docstrings_only": bool(docstrings_only),
    }
    return Dataset({"x": xtr, "y": ytr}, {"x": xte, "y": yte}, VOCAB, (seq_len,), "lm", info)


def decode(tokens) -> str:
    """Tokens (bytes) back to text, undecodable bytes replaced."""
    return bytes(np.asarray(tokens, np.uint8).tolist()).decode("utf-8", errors="replace")
