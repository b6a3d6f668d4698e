"""cconv._native: the lazily compiled XLA FFI kernel, its cache, its fallback, its thread-safety."""

import ctypes
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cconv import _native
from cconv.compressors import select


def _ffi(x, k):
    out = jax.ShapeDtypeStruct(x.shape[:-1] + (k,), jnp.int32)
    return jax.ffi.ffi_call(_native.TOPK_TARGET, out, vmap_method="broadcast_all")(x)


@pytest.fixture(scope="module")
def lib():
    assert _native.available(), _native.error()
    return _native.load()


def test_cache_key_tracks_source_compiler_and_jaxlib(lib, tmp_path, monkeypatch):
    cxx = _native.compiler()
    key = _native._build_key(cxx)
    source = _native.SOURCE
    cached = list((_native.cache_dir() / "native").glob(f"cconv_select-{key}.so"))
    assert cached, "the loaded library lives in the cache under its build key"
    edited = tmp_path / "select.cc"
    edited.write_text(_native.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(_native, "SOURCE", edited)
    assert _native._build_key(cxx) != key
    import jaxlib

    monkeypatch.setattr(_native, "SOURCE", source)
    assert _native._build_key(cxx) == key
    monkeypatch.setattr(jaxlib, "__version__", jaxlib.__version__ + ".post1")
    assert _native._build_key(cxx) != key


def test_cache_dir_is_configurable(monkeypatch, tmp_path):
    monkeypatch.setenv("CCONV_CACHE_DIR", str(tmp_path))
    assert _native.cache_dir() == tmp_path
    monkeypatch.delenv("CCONV_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _native.cache_dir() == tmp_path / "cconv"


def test_no_compiler_falls_back_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("CCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_native, "_state", {"tried": False, "lib": None, "error": None})
    with pytest.warns(RuntimeWarning, match="falling back to lax.top_k"):
        assert _native.load() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert not _native.available()
        x = jax.random.normal(jax.random.PRNGKey(0), (1000,))
        got = select.topk_indices(x, 7)  # the reference path, same set
    np.testing.assert_array_equal(got, np.sort(np.asarray(select.topk_indices_reference(x, 7))))
    assert "no C++ compiler" in _native.error()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("CCONV_NATIVE", "0")
    assert not _native.enabled() and _native.load() is None
    x = jnp.array([0.5, -3.0, 2.0, 0.1])
    jaxpr = str(jax.make_jaxpr(lambda v: select.topk_indices(v, 2))(x))
    assert "ffi_call" not in jaxpr and "top_k" in jaxpr
    np.testing.assert_array_equal(select.topk_indices(x, 2), [1, 2])


def test_enabled_path_calls_the_kernel(lib):
    jaxpr = str(jax.make_jaxpr(lambda v: select.topk_indices(v, 2))(jnp.ones(10)))
    assert "ffi_call" in jaxpr and "platform_index" in jaxpr


def test_kernel_rejects_bad_shapes_and_dtypes(lib):
    with pytest.raises(Exception, match="k > d"):
        jax.block_until_ready(jax.jit(lambda v: _ffi(v, 5))(jnp.ones(3)))
    with pytest.raises(Exception, match="dtype must be"):
        jax.block_until_ready(jax.jit(lambda v: _ffi(v, 1))(jnp.ones(3, jnp.int32)))


def test_kernel_batched_rows(lib):
    x = np.random.default_rng(0).standard_normal((5, 3000)).astype(np.float32)
    got = np.asarray(jax.jit(lambda v: _ffi(v, 40))(x))
    want = np.sort(np.argsort(-np.abs(x), axis=1, kind="stable")[:, :40], axis=1)
    np.testing.assert_array_equal(got, want)


def test_concurrent_calls_from_threads(lib):
    # XLA runs the kernel without the GIL; eight Python threads hammer it with different data.
    f = jax.jit(lambda v: select.topk_indices(v, 500))
    xs = [jax.random.normal(jax.random.PRNGKey(i), (100_000,)) for i in range(8)]
    want = [np.sort(np.asarray(select.topk_indices_reference(x, 500))) for x in xs]
    jax.block_until_ready(f(xs[0]))
    errors = []

    def work(i):
        try:
            for _ in range(3):
                np.testing.assert_array_equal(np.asarray(f(xs[i])), want[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.slow
def test_concurrent_first_builds_compile_once(tmp_path):
    # Several processes (mpirun) may start cold at once: the lock makes the first one build and
    # the others reuse its library; the atomic rename means no reader sees a partial file.
    out = tmp_path / "native" / "lib.so"
    threads = [threading.Thread(target=_native._compile, args=(_native.compiler(), out)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out.exists() and sorted(p.name for p in out.parent.iterdir()) == ["lib.so", "lib.so.lock"]
    lib = __import__("ctypes").CDLL(str(out))
    assert lib.cconv_native_abi_version() == _native.ABI_VERSION


# ------------------------------------------------------------------ the cache must be private
# Each test plants a library whose load constructor appends to a marker file, so "it was loaded"
# (another user's code ran in this process) is observable, not only "the kernel is unavailable".

_PLANTED_CC = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void planted() {
  const char* p = std::getenv("CCONV_TEST_PLANTED_MARK");
  if (p) { std::FILE* f = std::fopen(p, "a"); if (f) { std::fputs("loaded\n", f); std::fclose(f); } }
}
extern "C" int cconv_native_abi_version() { return 1; }
"""
OTHER_UID = 65534  # nobody: stands for another user
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="planting a directory of another uid needs root (chown)"
)


@pytest.fixture(scope="module")
def planted_so(tmp_path_factory):
    cxx = _native.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("planted")
    (d / "planted.cc").write_text(_PLANTED_CC)
    subprocess.run(
        [cxx, "-shared", "-fPIC", str(d / "planted.cc"), "-o", str(d / "planted.so")], check=True, capture_output=True
    )
    return d / "planted.so"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process state in which the kernel was never tried, and a marker for planted code."""
    monkeypatch.setattr(_native, "_state", {"tried": False, "lib": None, "error": None})
    marker = tmp_path / "planted-code-ran"
    monkeypatch.setenv("CCONV_TEST_PLANTED_MARK", str(marker))
    return marker


def _plant(planted_so, directory: Path, *, mode=0o700, uid=None, so_mode=0o755, so_uid=None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    so = directory / f"cconv_select-{_native._build_key(_native.compiler())}.so"
    shutil.copy(planted_so, so)  # a fresh inode: the dynamic loader would really map it again
    os.chmod(so, so_mode)
    if so_uid is not None:
        os.chown(so, so_uid, -1)
    os.chmod(directory, mode)
    if uid is not None:
        os.chown(directory, uid, -1)
    return so


def _assert_refused(marker, *reason):
    """The planted code never ran; exactly one warning; the lax.top_k fallback is what runs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _native.load() is None
        assert _native.load() is None and not _native.available()
        x = jax.random.normal(jax.random.PRNGKey(1), (500,))
        jaxpr = str(jax.make_jaxpr(lambda v: select.topk_indices(v, 5))(x))
    assert not marker.exists(), "another user's library was loaded into this process"
    fallbacks = [w for w in caught if "falling back to lax.top_k" in str(w.message)]
    assert len(fallbacks) == 1 and len(caught) == 1, [str(w.message) for w in caught]
    assert "ffi_call" not in jaxpr and "top_k" in jaxpr
    for r in reason:
        assert r in _native.error(), _native.error()


@pytest.fixture
def unwritable_home(monkeypatch, tmp_path):
    """Point the primary cache at a place where directories cannot be created."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        place = Path("/sys/cconv-test-unwritable")  # root bypasses modes, not sysfs
        try:
            os.mkdir(place)
        except PermissionError:
            pass
        else:
            os.rmdir(place)
            pytest.skip("no unwritable place for root here")
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        place = ro / "cache"
    monkeypatch.setenv("CCONV_CACHE_DIR", str(place))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # what $TMPDIR selects
    return tmp / f"cconv-{os.getuid()}"


@as_root
def test_tmp_fallback_planted_by_another_user_is_refused(unwritable_home, fresh, planted_so):
    # The reported defect: home cache unwritable -> predictable $TMPDIR/cconv-<uid>, which
    # another user created first and filled.
    _plant(planted_so, unwritable_home / "native", mode=0o755, uid=OTHER_UID, so_uid=OTHER_UID)
    os.chown(unwritable_home, OTHER_UID, -1)
    os.chmod(unwritable_home, 0o755)
    _assert_refused(fresh, f"owned by uid {OTHER_UID}")
    st = os.lstat(unwritable_home)  # refused, not repaired: someone else's dir is left alone
    assert st.st_uid == OTHER_UID and stat.S_IMODE(st.st_mode) == 0o755


@as_root
def test_tmp_fallback_private_mode_but_wrong_owner_is_refused(unwritable_home, fresh, planted_so):
    _plant(planted_so, unwritable_home / "native")
    os.chown(unwritable_home, OTHER_UID, -1)
    os.chmod(unwritable_home, 0o700)
    _assert_refused(fresh, f"owned by uid {OTHER_UID}")


def test_tmp_fallback_symlinked_to_elsewhere_is_refused(unwritable_home, fresh, planted_so, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _plant(planted_so, elsewhere / "native")
    os.chmod(elsewhere, 0o700)
    unwritable_home.symlink_to(elsewhere, target_is_directory=True)
    _assert_refused(fresh, "symlink")


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777], ids=oct)
def test_tmp_fallback_writable_by_others_is_refused_and_not_chmodded(unwritable_home, fresh, planted_so, mode):
    _plant(planted_so, unwritable_home / "native")
    os.chmod(unwritable_home, mode)
    _assert_refused(fresh, "writable by group or others")
    assert stat.S_IMODE(os.lstat(unwritable_home).st_mode) == mode


@as_root
def test_cache_dir_of_another_user_is_refused(monkeypatch, tmp_path, fresh, planted_so):
    monkeypatch.setenv("CCONV_CACHE_DIR", str(tmp_path / "theirs"))
    _plant(planted_so, tmp_path / "theirs" / "native", uid=OTHER_UID, so_uid=OTHER_UID)
    _assert_refused(fresh, f"owned by uid {OTHER_UID}")


@pytest.mark.parametrize("where", ["base", "native"])
@pytest.mark.parametrize("mode", [0o775, 0o757], ids=oct)
def test_cache_dir_writable_by_others_is_refused(monkeypatch, tmp_path, fresh, planted_so, where, mode):
    base = tmp_path / "cache"
    monkeypatch.setenv("CCONV_CACHE_DIR", str(base))
    _plant(planted_so, base / "native")
    os.chmod(base if where == "base" else base / "native", mode)
    _assert_refused(fresh, "writable by group or others")


def test_symlinked_native_dir_is_refused(monkeypatch, tmp_path, fresh, planted_so):
    base = tmp_path / "cache"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("CCONV_CACHE_DIR", str(base))
    _plant(planted_so, tmp_path / "elsewhere")
    (base / "native").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    _assert_refused(fresh, "symlink")


@pytest.mark.parametrize("case", ["other-owner", "group-writable", "world-writable", "symlink", "not-a-file"])
def test_unsafe_library_file_is_refused(monkeypatch, tmp_path, fresh, planted_so, case):
    if case == "other-owner" and not (hasattr(os, "geteuid") and os.geteuid() == 0):
        pytest.skip("needs root (chown)")
    base = tmp_path / "cache"
    monkeypatch.setenv("CCONV_CACHE_DIR", str(base))
    so = _plant(
        planted_so,
        base / "native",
        so_mode={"group-writable": 0o775, "world-writable": 0o757}.get(case, 0o755),
        so_uid=OTHER_UID if case == "other-owner" else None,
    )
    os.chmod(base, 0o700)
    if case == "symlink":
        target = tmp_path / "elsewhere.so"
        os.replace(so, target)
        so.symlink_to(target)
    elif case == "not-a-file":
        so.unlink()
        so.mkdir()
    _assert_refused(
        fresh,
        {"other-owner": f"owned by uid {OTHER_UID}", "symlink": "symlink", "not-a-file": "not a regular file"}.get(
            case, "writable by group or others"
        ),
    )


def _count_compiles(monkeypatch):
    calls = []
    real = _native._compile

    def counting(cxx, out):
        calls.append(out)
        return real(cxx, out)

    monkeypatch.setattr(_native, "_compile", counting)
    return calls


def _assert_private(path: Path):
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)


@pytest.mark.slow
def test_normal_path_creates_private_dirs_compiles_once_and_loads(monkeypatch, tmp_path):
    # A permissive umask (Debian/Ubuntu default for users) must not make our own cache unsafe.
    base = tmp_path / "fresh" / "cache"
    monkeypatch.setenv("CCONV_CACHE_DIR", str(base))
    calls = _count_compiles(monkeypatch)
    old = os.umask(0o002)
    try:
        out = _native._locate(_native.compiler())
        again = _native._locate(_native.compiler())
    finally:
        os.umask(old)
    assert out == again == base / "native" / out.name and len(calls) == 1
    _assert_private(base)
    _assert_private(base / "native")
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
    lib = ctypes.CDLL(str(out))
    assert lib.cconv_native_abi_version() == _native.ABI_VERSION


@pytest.mark.slow
def test_tmp_fallback_is_per_user_private_and_compiles_once(unwritable_home, monkeypatch):
    calls = _count_compiles(monkeypatch)
    out = _native._locate(_native.compiler())
    assert _native._locate(_native.compiler()) == out and len(calls) == 1
    assert out.parent == unwritable_home / "native"
    assert unwritable_home.name == f"cconv-{os.getuid()}"
    _assert_private(unwritable_home)
    _assert_private(unwritable_home / "native")
    assert ctypes.CDLL(str(out)).cconv_native_abi_version() == _native.ABI_VERSION
