"""Loaders for image datasets kept in a local directory: MNIST, Fashion-MNIST (IDX), CIFAR-10 (pickle).

Nothing is downloaded.  ``root`` (or, when it is None, ``$CCONV_DATA``, default
``~/.cache/cconv/data``) is searched for the standard files, directly and in the usual
sub-directories:

=============  ==============================================================  =====================
dataset        files                                                           searched in
=============  ==============================================================  =====================
mnist          train-images-idx3-ubyte, train-labels-idx1-ubyte,               root, root/mnist,
               t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each plain      root/MNIST/raw
               or ``.gz``), as distributed by LeCun et al.
fashion_mnist  the same four names (Xiao et al. 2017 keep MNIST's format)      root, root/fashion_mnist,
                                                                               root/fashion-mnist,
                                                                               root/FashionMNIST/raw
cifar10        data_batch_1 .. data_batch_5, test_batch (python pickles of     root/cifar-10-batches-py,
               ``{b"data": uint8[10000, 3072], b"labels": [...]}``, rows are   root, root/cifar10/
               the R, G, B planes of a 32x32 image; Krizhevsky 2009)           cifar-10-batches-py
=============  ==============================================================  =====================

IDX format (LeCun et al.): a big-endian header ``0x00 0x00 <type> <ndim>`` followed by ``ndim``
big-endian uint32 sizes and the data, big-endian, in row-major order; type codes 0x08 uint8,
0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64.  ``read_idx`` checks that the
header and the file size agree.

CIFAR-10 pickles are read with a restricted unpickler that only reconstructs NumPy arrays (and
the builtins the format needs): a tampered file cannot run code.

Images are returned NHWC float32, standardised per channel with the training set's mean and
standard deviation; labels int32.  ``train_size``/``test_size`` keep the first n samples of each
split (the files' own order), for quick runs.
"""

from __future__ import annotations

import gzip
import math
import os
import pickle
import zlib
from pathlib import Path

import numpy as np

from cconv.data.base import Dataset, standardise_channels
from cconv.data.embedded import _check_int

IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
MNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
SUBDIRS = {
    "mnist": ("", "mnist", "MNIST/raw"),
    "fashion_mnist": ("", "fashion_mnist", "fashion-mnist", "FashionMNIST/raw"),
    "cifar10": ("cifar-10-batches-py", "", "cifar10/cifar-10-batches-py"),
}
FASHION_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def default_root() -> Path:
    """``$CCONV_DATA`` or ``~/.cache/cconv/data``."""
    return Path(os.environ.get("CCONV_DATA", "~/.cache/cconv/data")).expanduser()


# ----------------------------------------------------------------------------------------- IDX
MAX_IDX_BYTES = 1 << 30  # an IDX file's data (after decompression) is at most 1 GiB: MNIST's largest is 47 MB


def _read_exactly(f, n: int) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer only at its end)."""
    chunks, left = [], n
    while left > 0:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_idx(path: str | os.PathLike, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed, by the ``.gz`` suffix) into a NumPy array.

    The header is read and checked first (magic number, then the size it declares, at most
    ``max_bytes``); then exactly the bytes it declares are read (decompressed), plus one to find
    out whether the file is longer.  A compressed file is never decompressed beyond that: a gzip
    bomb costs at most ``max_bytes``, and a file whose magic number is wrong costs 4 bytes."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            return _read_idx_stream(f, path, max_bytes)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot be read as an IDX file ({type(e).__name__}: {e})") from None


def _read_idx_stream(f, path: Path, max_bytes: int) -> np.ndarray:
    head = _read_exactly(f, 4)
    if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number {head[:4].hex()})")
    ndim = head[3]
    dims = _read_exactly(f, 4 * ndim)
    if len(dims) < 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(s) for s in np.frombuffer(dims, ">u4", count=ndim))
    dtype = np.dtype(IDX_TYPES[head[2]])
    size = math.prod(shape) * dtype.itemsize
    header = 4 + 4 * ndim
    if size > max_bytes:
        raise ValueError(
            f"{path}: IDX header says shape {shape} ({size} bytes of data), more than the {max_bytes} bytes "
            f"an IDX file may hold here; refusing to read it"
        )
    raw = _read_exactly(f, size + 1)
    if len(raw) != size:
        got = f"{header + len(raw)} bytes" if len(raw) < size else "more"
        raise ValueError(
            f"{path}: IDX header says shape {shape} ({header + size} bytes) but the file has {got}"
            + (" (decompressed)" if path.suffix == ".gz" else "")
        )
    return np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzip-compressed when ``path`` ends in ``.gz``)."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in IDX_TYPES.items()}
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None:
        raise ValueError(f"IDX cannot store dtype {array.dtype}; valid: uint8, int8, int16, int32, float32, float64")
    head = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    body = array.astype(IDX_TYPES[code]).tobytes()
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(head + body)


# ------------------------------------------------------------------------------- file discovery
def _find(name: str, root, files: tuple[str, ...], allow_gz: bool) -> dict[str, Path]:
    """The directory under ``root`` holding all ``files``; ValueError naming what was expected."""
    base = Path(root).expanduser() if root is not None else default_root()
    dirs = [base / sub if sub else base for sub in SUBDIRS[name]]
    best: tuple[int, Path, list[str]] | None = None
    for d in dirs:
        found, missing = {}, []
        for fname in files:
            cands = [d / fname] + ([d / (fname + ".gz")] if allow_gz else [])
            hit = next((c for c in cands if c.is_file()), None)
            if hit is None:
                missing.append(fname + ("[.gz]" if allow_gz else ""))
            else:
                found[fname] = hit
        if not missing:
            return found
        if best is None or len(found) > best[0]:
            best = (len(found), d, missing)
    where = " or ".join(str(d) for d in dirs)
    if not any(d.is_dir() for d in dirs):
        raise ValueError(
            f"{name}: data directory not found: expected {', '.join(files)} in {where} "
            f"(no download at run time; pass root=DIR or set CCONV_DATA)"
        )
    if best[0] == 0:
        raise ValueError(
            f"{name}: no data files: expected {', '.join(files)} in {where} "
            f"(no download at run time; pass root=DIR or set CCONV_DATA)"
        )
    _, d, missing = best
    raise ValueError(f"{name}: missing {', '.join(missing)} in {d} (searched {where}; pass root=DIR or set CCONV_DATA)")


def _subset(x, y, n, what):
    if n is None:
        return x, y
    n = _check_int(what, n, 1, len(y))
    return x[:n], y[:n]


# -------------------------------------------------------------------------------- MNIST family
def _load_idx_dataset(name: str, root, train_size, test_size, classes) -> Dataset:
    paths = _find(name, root, tuple(MNIST_FILES.values()), allow_gz=True)
    arr = {k: read_idx(paths[v]) for k, v in MNIST_FILES.items()}
    for split in ("train", "test"):
        x, y = arr[f"{split}_x"], arr[f"{split}_y"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(
                f"{name}: {split} images have shape {x.shape} and labels {y.shape}; expected [N, H, W] and [N]"
            )
        if y.size and (y.min() < 0 or y.max() >= len(classes)):
            raise ValueError(f"{name}: {split} labels outside 0..{len(classes) - 1}")
    xtr, ytr = _subset(arr["train_x"], arr["train_y"], train_size, "train_size")
    xte, yte = _subset(arr["test_x"], arr["test_y"], test_size, "test_size")
    xtr, xte, mean, std = standardise_channels(xtr[..., None], xte[..., None])
    info = {
        "name": name,
        "files": {k: str(p) for k, p in paths.items()},
        "classes": list(classes),
        "mean": mean.tolist(),
        "std": std.tolist(),
    }
    return Dataset(
        {"x": xtr, "y": ytr.astype(np.int32)},
        {"x": xte, "y": yte.astype(np.int32)},
        len(classes),
        tuple(xtr.shape[1:]),
        "classification",
        info,
    )


def mnist(root=None, train_size: int | None = None, test_size: int | None = None) -> Dataset:
    """MNIST (LeCun et al. 1998) from the four IDX files in a local directory (module docstring)."""
    return _load_idx_dataset("mnist", root, train_size, test_size, tuple(str(i) for i in range(10)))


def fashion_mnist(root=None, train_size: int | None = None, test_size: int | None = None) -> Dataset:
    """Fashion-MNIST (Xiao et al. 2017), same IDX files as MNIST (module docstring)."""
    return _load_idx_dataset("fashion_mnist", root, train_size, test_size, FASHION_CLASSES)


# ------------------------------------------------------------------------------------- CIFAR-10
class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only reconstructs NumPy arrays: CIFAR batches need nothing else."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        if module == "numpy.core.multiarray":  # NumPy 1 pickles on NumPy 2
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch -> (uint8 images [N, 32, 32, 3], int32 labels [N])."""
    try:
        with open(path, "rb") as f:
            d = _ArrayUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise ValueError(f"{path}: not a CIFAR-10 python batch ({err})") from None
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (expected a dict with b'data' and b'labels')")
    data, labels = np.asarray(d[b"data"]), np.asarray(d[b"labels"], np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ValueError(
            f"{path}: data has shape {data.shape} and {len(labels)} labels; expected [N, 3072] uint8 and N labels"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: labels outside 0..9")
    x = data.astype(np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, labels.astype(np.int32)


def cifar10(root=None, train_size: int | None = None, test_size: int | None = None) -> Dataset:
    """CIFAR-10 (Krizhevsky 2009) from the python pickle batches in a local directory."""
    paths = _find("cifar10", root, CIFAR10_FILES, allow_gz=False)
    parts = [read_cifar_batch(paths[f]) for f in CIFAR10_FILES[:5]]
    xtr, ytr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    xte, yte = read_cifar_batch(paths["test_batch"])
    xtr, ytr = _subset(xtr, ytr, train_size, "train_size")
    xte, yte = _subset(xte, yte, test_size, "test_size")
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    xtr, xte, mean, std = standardise_channels(xtr, xte)
    info = {
        "name": "cifar10",
        "files": {k: str(p) for k, p in paths.items()},
        "classes": classes,
        "mean": mean.tolist(),
        "std": std.tolist(),
    }
    return Dataset({"x": xtr, "y": ytr}, {"x": xte, "y": yte}, 10, (32, 32, 3), "classification", info)
