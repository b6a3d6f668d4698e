"""Native CPU kernels (C++ XLA FFI), compiled lazily on first use.

cconv is a pure-Python package; its one native kernel (``select.cc``: exact top-k selection by
magnitude in one streaming pass, see ``cconv.compressors.select``) is compiled the first time
it is needed, not at install time, because

* the kernel is built against the XLA FFI headers that ship *inside the installed jaxlib*
  (``jax.ffi.include_dir()``), so a build made at install time would silently go stale when
  jaxlib is upgraded, and build isolation would need jaxlib as a build requirement;
* a missing compiler must never make ``pip install`` fail: the framework then runs with
  ``lax.top_k`` (exact too, only slower) after a one-time warning.

Build: ``$CXX`` (else ``g++``, ``c++`` or ``clang++`` on PATH) with
``-O3 -std=c++17 -shared -fPIC`` (no ``-march=native``: a cache in a home directory shared by
heterogeneous cluster nodes must not hold illegal instructions).  The shared library is cached
in ``$CCONV_CACHE_DIR`` (default ``$XDG_CACHE_HOME/cconv`` or ``~/.cache/cconv``) under a name
keyed by the SHA-256 of the source, the compiler command and the jaxlib version, so an edit or
an upgrade triggers a rebuild and stale libraries are never loaded.  Concurrent first uses
(several processes, e.g. ``mpirun``) serialise on a file lock and the library is moved into
place atomically.  Compilation takes a few seconds once per machine.  Where the cache cannot be
written (read-only home), the per-user ``$TMPDIR/cconv-<uid>`` is used instead.

Loading a library runs its code in this process, so the cache must be private.  The cache
directory and its ``native`` subdirectory are created with ``os.mkdir(path, 0o700)`` (atomic:
no window with a wider mode) and then checked with ``lstat``: each must be a real directory
(not a symlink), owned by the current user and writable by nobody else (no group/other write
bit); the library file must be a regular file (not a symlink) with the same owner and mode
rule.  A directory or file that fails a check is refused and left as it is (never chmod-ed or
chown-ed: it may be someone else's), and the framework falls back to ``lax.top_k`` with the
one-time warning, which names the offending path.  Not checked: the ancestors of the cache
directory (``~``, ``~/.cache``) and ACLs; a parent others can write would let them swap the
directory between the check and ``dlopen``.

``CCONV_NATIVE=0`` disables the kernels (everything falls back to pure JAX); this is how the
benchmark suite measures the fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("select.cc")
ABI_VERSION = 1
TOPK_TARGET = "cconv_topk_indices"
CXXFLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")

# Creating a cache here fails for want of permission: try the next place (the per-user $TMPDIR).
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)

_lock = threading.Lock()
_state: dict = {"tried": False, "lib": None, "error": None}


def enabled() -> bool:
    """False when the user disabled native kernels with CCONV_NATIVE=0."""
    return os.environ.get("CCONV_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """Where compiled kernels are cached (created on demand)."""
    env = os.environ.get("CCONV_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cconv"


def compiler() -> str | None:
    """The C++ compiler that would be used, or None."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _build_key(cxx: str) -> str:
    import jaxlib

    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(" ".join((os.path.basename(cxx), *CXXFLAGS)).encode())
    h.update(jaxlib.__version__.encode())
    return h.hexdigest()[:16]


class UnsafeCacheError(RuntimeError):
    """A cache directory or library that someone other than the current user could have written."""


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _check_owner_mode(path: Path, st: os.stat_result) -> None:
    uid = _uid()
    if uid is not None and st.st_uid != uid:
        raise UnsafeCacheError(
            f"{path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {uid}); refusing to load from it (set CCONV_CACHE_DIR "
            "to a directory of your own)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"{path} is writable by group or others (mode "
            f"{oct(stat.S_IMODE(st.st_mode))}); refusing to load from it "
            f"(chmod go-w {path}, or set CCONV_CACHE_DIR)"
        )


def _check_private_dir(path: Path) -> None:
    """Raise UnsafeCacheError unless ``path`` is a real directory, ours, that nobody else can write."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(f"{path} is a symlink; refusing to load from it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"{path} is not a directory; refusing to load from it")
    _check_owner_mode(path, st)


def _check_library(path: Path) -> None:
    """Raise UnsafeCacheError unless ``path`` is a regular file, ours, that nobody else can write."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(f"{path} is a symlink; refusing to load it")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeCacheError(f"{path} is not a regular file; refusing to load it")
    _check_owner_mode(path, st)


def _private_dir(path: Path) -> Path:
    """``path`` as a private directory: created with mode 0700 if missing, then lstat-verified.

    An existing directory is verified, never repaired.  Missing ancestors are created (mode
    0700) but not verified.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # the mode applies at creation (masked by umask: never wider)
    except FileExistsError:
        pass
    _check_private_dir(path)
    return path


def _candidates() -> list[Path]:
    uid = _uid()
    return [cache_dir(), Path(tempfile.gettempdir()) / ("cconv" if uid is None else f"cconv-{uid}")]


def _locate(cxx: str) -> Path:
    """The verified path of the compiled library for ``cxx``, built first if missing.

    Tries ``cache_dir()``, then the per-user ``$TMPDIR/cconv-<uid>`` when the former cannot be
    created or written.  Raises UnsafeCacheError (no fallback) when a directory or the library
    fails the privacy checks, RuntimeError when no place is writable or the build fails.
    """
    name = f"cconv_select-{_build_key(cxx)}.so"
    last_err = None
    for base in _candidates():
        try:
            out = _private_dir(_private_dir(base) / "native") / name
            if not os.path.lexists(out):
                _compile(cxx, out)
            _check_library(out)
            return out
        except OSError as e:
            if e.errno not in _UNWRITABLE:
                raise
            last_err = e  # unwritable cache dir: try the next location
    raise RuntimeError(f"cannot write a kernel cache ({last_err})")


def _compile(cxx: str, out: Path) -> None:
    import jax.ffi

    _private_dir(out.parent)
    with _file_lock(out.parent / (out.name + ".lock")):
        if os.path.lexists(out):  # another process built it while we waited
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        cmd = [cxx, *CXXFLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise RuntimeError(f"{' '.join(cmd)} failed: {msg[-1] if msg else proc.returncode}")
        os.chmod(tmp, 0o700)  # the linker's mode follows the umask (002 would be group-writable)
        os.replace(tmp, out)  # atomic: readers see either nothing or the whole library


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive advisory lock (POSIX flock); without fcntl, the atomic rename alone protects."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _load():
    """Compile (if needed), dlopen and register the FFI targets; raises on any failure."""
    import jax
    import jax.ffi

    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    out = _locate(cxx)
    lib = ctypes.CDLL(str(out))
    if lib.cconv_native_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{out} has ABI {lib.cconv_native_abi_version()}, expected {ABI_VERSION}")
    jax.ffi.register_ffi_target(TOPK_TARGET, jax.ffi.pycapsule(lib.CconvTopkIndices), platform="cpu")
    return lib


def load():
    """The loaded native library, or None (disabled, no compiler, build failure).

    Thread-safe and idempotent: the first call compiles/loads and registers the FFI targets;
    a failure is reported once with a warning and remembered (no retry in this process).
    """
    if not enabled():
        return None
    if _state["tried"]:
        return _state["lib"]
    with _lock:
        if not _state["tried"]:
            try:
                _state["lib"] = _load()
            except Exception as e:  # noqa: BLE001 - any failure means "use the fallback"
                _state["error"] = f"{type(e).__name__}: {e}"
                warnings.warn(
                    "cconv: native CPU top-k kernel unavailable, falling back to lax.top_k on CPU (exact, "
                    f"slower; GPU and TPU steps use lax.top_k anyway): {_state['error']}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            _state["tried"] = True
    return _state["lib"]


def available() -> bool:
    """True when the native CPU kernels are compiled, loaded and registered."""
    return load() is not None


def error() -> str | None:
    """Why the kernels are unavailable (None if they are available or not tried yet)."""
    return _state["error"]
