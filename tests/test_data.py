"""cconv.data: embedded datasets, file loaders (on files written here in the official formats),
the text corpus, partitions and the batcher."""

import gzip
import json
import pickle
import struct
import sysconfig
from pathlib import Path

import jax
import numpy as np
import pytest

import cconv.data as D
from cconv.data.text import STDLIB_MODULES, decode


@pytest.fixture(scope="module")
def digits():
    return D.load("digits")


# ------------------------------------------------------------------------------------ registry
def test_registry_and_bad_names():
    assert D.names() == sorted(
        ["digits", "least_squares", "logistic", "mnist", "fashion_mnist", "cifar10", "text", "mnist1d"]
    )
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; valid names: cifar10, digits"):
        D.load("imagenet")
    with pytest.raises(ValueError, match="unknown hyper-parameter.*bogus; valid: train_size, flat"):
        D.load("digits", bogus=1)
    with pytest.raises(ValueError, match="embedded and takes no root"):
        D.load("least_squares", root="/tmp")
    with pytest.raises(ValueError, match="train_size must be an integer"):
        D.load("digits", train_size=0)


# -------------------------------------------------------------------------------------- digits
def test_digits_split_and_standardisation(digits):
    ds = digits
    assert ds.task == "classification" and ds.num_classes == 10 and ds.input_shape == (8, 8, 1)
    assert ds.train["x"].shape == (1500, 8, 8, 1) and ds.test["x"].shape == (297, 8, 8, 1)
    assert ds.train["x"].dtype == np.float32 and ds.train["y"].dtype == np.int32
    # one mean/std over all training pixels: the training split is exactly standardised
    assert abs(ds.train["x"].mean()) < 1e-5 and abs(ds.train["x"].std() - 1) < 1e-5
    # every class in both splits, the split is fixed and disjoint from sklearn's order
    assert set(np.unique(ds.train["y"])) == set(range(10)) == set(np.unique(ds.test["y"]))
    again = D.load("digits")
    np.testing.assert_array_equal(again.train["x"], ds.train["x"])
    from sklearn.datasets import load_digits

    raw = load_digits().data
    rows = {r.tobytes() for r in raw}
    restored = ds.test["x"].reshape(-1, 64) * ds.info["std"][0] + ds.info["mean"][0]
    assert all(np.round(r).astype(np.float64).tobytes() in rows for r in restored[:20])
    flat = D.load("digits", flat=True)
    assert flat.input_shape == (64,) and flat.train["x"].shape == (1500, 64)


def test_digits_are_read_exactly_as_scikit_learn_loads_them():
    """cconv reads the digits file sklearn ships without importing sklearn (a speed-up of every
    process that loads digits); the arrays are load_digits()'s, bit for bit."""
    from sklearn.datasets import load_digits

    from cconv.data.embedded import _load_digits

    data, target = _load_digits()
    raw = load_digits()
    assert data.dtype == raw.data.dtype and data.tobytes() == raw.data.tobytes()
    assert data.shape == raw.data.shape == (1797, 64)
    assert target.dtype == raw.target.dtype and np.array_equal(target, raw.target)


# ---------------------------------------------------------------------- synthetic known optima
def test_info_is_json_serialisable(digits):
    for ds in (digits, D.load("least_squares"), D.load("logistic"), D.load("text", max_bytes=4096)):
        assert json.loads(json.dumps(ds.info))["name"] == ds.info["name"]


def test_least_squares_optimum_is_exact():
    ds = D.load("least_squares", dim=8, train_size=512, test_size=64, noise=0.1, cond=100.0, seed=3)
    info, a, y = ds.info, ds.train["x"].astype(np.float64), ds.train["y"].astype(np.float64)
    n, d = a.shape
    r = a @ np.asarray(info["w_star"]) + info["b_star"] - y
    grad = np.concatenate([2 * a.T @ r / n, [2 * r.mean()]])  # gradient of the MSE
    assert np.linalg.norm(grad) < 1e-5
    assert info["optimal_loss"] == pytest.approx(np.mean(r**2), rel=1e-6)
    # E[residual MSE] = sigma^2 (n - d - 1) / n, sd = sigma^2 sqrt(2 (n - d - 1)) / n
    mean, sd = 0.01 * (n - d - 1) / n, 0.01 * np.sqrt(2 * (n - d - 1)) / n
    assert abs(info["optimal_loss"] - mean) < 5 * sd
    assert info["L"] / info["mu"] > 10  # cond = 100 makes the problem ill-conditioned
    exact = D.load("least_squares", dim=8, train_size=64, test_size=8, noise=0.0)
    np.testing.assert_allclose(exact.info["w_star"], exact.info["w_true"], atol=1e-8)
    assert exact.info["optimal_loss"] < 1e-12
    np.testing.assert_allclose(exact.info["b_star"], exact.info["b_true"], atol=1e-8)


def _logistic_grad(x, y, w, b, l2):
    p = 1 / (1 + np.exp(-(x @ w + b)))
    return np.concatenate([x.T @ (p - y) / len(y) + l2 * w, [np.mean(p - y)]])


def test_logistic_optimum_and_generating_w():
    ds = D.load("logistic", dim=10, train_size=4000, test_size=100, seed=1)
    info = {k: np.asarray(v) if isinstance(v, list) else v for k, v in ds.info.items()}
    x, y = ds.train["x"].astype(np.float64), ds.train["y"]
    assert ds.num_classes == 2 and set(np.unique(y)) == {0, 1}
    assert np.linalg.norm(_logistic_grad(x, y, info["w_opt"], info["b_opt"], 0.0)) < 1e-8
    # the MLE is consistent: |w_opt - w_true|^2 ~ tr(I^-1)/n with I the Fisher information
    p = 1 / (1 + np.exp(-(x @ info["w_true"] + info["b_true"])))
    xa = np.hstack([x, np.ones((len(y), 1))])
    fisher = (xa * (p * (1 - p))[:, None]).T @ xa / len(y)
    expected = np.trace(np.linalg.inv(fisher)) / len(y)
    err = np.sum((np.append(info["w_opt"], info["b_opt"]) - np.append(info["w_true"], info["b_true"])) ** 2)
    assert err < 5 * expected
    reg = D.load("logistic", dim=10, train_size=4000, test_size=100, seed=1, l2=0.1)
    w_reg = np.asarray(reg.info["w_opt"])
    assert np.linalg.norm(_logistic_grad(x, y, w_reg, reg.info["b_opt"], 0.1)) < 1e-8
    assert np.linalg.norm(w_reg) < np.linalg.norm(info["w_opt"])
    assert reg.info["optimal_loss"] > reg.info["optimal_data_loss"] > info["optimal_data_loss"]
    with pytest.raises(ValueError, match="linearly separable"):
        D.load("logistic", dim=30, train_size=20)


# ------------------------------------------------------------------------- MNIST family (IDX)
def _idx_bytes(array: np.ndarray, code: int) -> bytes:
    """IDX by hand (independent of cconv.data.write_idx): magic, big-endian dims, data."""
    head = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return head + array.astype(">u1" if code == 8 else ">i4").tobytes()


def _write_mnist(d: Path, rng, n_train=12, n_test=5, gz=False):
    d.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for name, arr in arrays.items():
        data = _idx_bytes(arr, 8)
        if gz:
            with gzip.open(d / (name + ".gz"), "wb") as f:
                f.write(data)
        else:
            (d / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("name,sub,gz", [("mnist", "", False), ("fashion_mnist", "fashion_mnist", True)])
def test_mnist_family_from_idx_files(tmp_path, name, sub, gz):
    arrays = _write_mnist(tmp_path / sub if sub else tmp_path, np.random.default_rng(0), gz=gz)
    ds = D.load(name, root=tmp_path)
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10 and ds.task == "classification"
    assert ds.train["x"].shape == (12, 28, 28, 1) and ds.test["x"].shape == (5, 28, 28, 1)
    np.testing.assert_array_equal(ds.train["y"], arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.test["y"], arrays["t10k-labels-idx1-ubyte"])
    mean, std = ds.info["mean"][0], ds.info["std"][0]
    np.testing.assert_allclose(ds.test["x"][..., 0] * std + mean, arrays["t10k-images-idx3-ubyte"], atol=1e-3)
    assert abs(ds.train["x"].mean()) < 1e-4
    small = D.load(name, root=tmp_path, train_size=4, test_size=2)
    np.testing.assert_array_equal(small.train["y"], arrays["train-labels-idx1-ubyte"][:4])


def test_idx_roundtrip_and_corruption(tmp_path):
    for dtype in (np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64):
        a = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
        for suffix in ("", ".gz"):
            D.write_idx(tmp_path / f"a{suffix}", a)
            b = D.read_idx(tmp_path / f"a{suffix}")
            assert b.dtype == np.dtype(dtype) and b.shape == a.shape
            np.testing.assert_array_equal(a, b)
    (tmp_path / "hand").write_bytes(_idx_bytes(np.array([[1, 2], [3, 400]]), 0x0C))
    np.testing.assert_array_equal(D.read_idx(tmp_path / "hand"), [[1, 2], [3, 400]])
    (tmp_path / "short").write_bytes(_idx_bytes(np.zeros((3, 4), np.uint8), 8)[:-1])
    with pytest.raises(ValueError, match="IDX header says shape"):
        D.read_idx(tmp_path / "short")
    (tmp_path / "junk").write_bytes(b"GIF89a" + bytes(20))
    with pytest.raises(ValueError, match="not an IDX file"):
        D.read_idx(tmp_path / "junk")


# ------------------------------------------------------------------------- CIFAR-10 (pickle)
def _write_cifar(d: Path, rng, per_batch=4, n_test=3):
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = n_test if name == "test_batch" else per_batch
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img{i}.png".encode() for i in range(n)],
        }
        with open(d / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        out[name] = batch
    return out


def test_cifar10_from_pickle_batches(tmp_path):
    batches = _write_cifar(tmp_path / "cifar-10-batches-py", np.random.default_rng(1))
    ds = D.load("cifar10", root=tmp_path)
    assert ds.input_shape == (32, 32, 3) and ds.train["x"].shape == (20, 32, 32, 3)
    assert ds.test["x"].shape == (3, 32, 32, 3)
    labels = [batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)]
    assert ds.train["y"].tolist() == sum(labels, [])
    # pixel (n, h, w, c) is byte c*1024 + h*32 + w of row n (R, G, B planes, row-major)
    raw = batches["test_batch"][b"data"].astype(np.float64)
    mean, std = np.array(ds.info["mean"]), np.array(ds.info["std"])
    x = ds.test["x"] * std + mean
    for n, h, w, c in [(0, 0, 0, 0), (1, 5, 7, 1), (2, 31, 30, 2), (0, 16, 3, 2)]:
        assert x[n, h, w, c] == pytest.approx(raw[n, c * 1024 + h * 32 + w], abs=1e-3)
    np.testing.assert_allclose(ds.train["x"].mean(axis=(0, 1, 2)), 0, atol=1e-4)


def test_cifar10_refuses_code_in_pickles(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    _write_cifar(d, np.random.default_rng(2))
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    with open(d / "data_batch_3", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": [0]}, f, protocol=2)
    with pytest.raises(ValueError, match="refusing to unpickle"):
        D.load("cifar10", root=tmp_path)
    assert not marker.exists()


def test_missing_directory_and_files_one_clear_line(tmp_path):
    with pytest.raises(ValueError) as err:
        D.load("mnist", root=tmp_path / "nowhere")
    msg = str(err.value)
    assert "\n" not in msg and "not found" in msg and "train-images-idx3-ubyte" in msg
    assert str(tmp_path / "nowhere") in msg
    d = tmp_path / "c" / "cifar-10-batches-py"
    _write_cifar(d, np.random.default_rng(3))
    (d / "test_batch").unlink()
    with pytest.raises(ValueError, match=r"cifar10: missing test_batch in .*cifar-10-batches-py"):
        D.load("cifar10", root=tmp_path / "c")
    with pytest.raises(ValueError, match="no data files: expected data_batch_1"):
        D.load("cifar10", root=tmp_path)


# ---------------------------------------------------------------------------------------- text
def test_text_corpus_is_the_stdlib_bytes():
    ds = D.load("text", seq_len=32, max_bytes=40_000)
    x, y = ds.train["x"], ds.train["y"]
    assert ds.task == "lm" and ds.num_classes == 256 and ds.input_shape == (32,)
    assert x.dtype == np.int32 and x.shape[1] == 32 and x.shape == y.shape
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    np.testing.assert_array_equal(x[1:, 0], y[:-1, -1])  # windows tile the byte stream
    first = Path(sysconfig.get_paths()["stdlib"], f"{STDLIB_MODULES[0]}.py").read_bytes()
    assert bytes(x[0].astype(np.uint8)) == first[:32]
    assert ds.info["bytes"] == 40_000 and len(ds.info["sha256"]) == 64
    n_test = round(40_000 * 0.1)
    assert ds.test["x"].shape == ((n_test - 1) // 32, 32)
    assert D.load("text", seq_len=32, max_bytes=40_000).info["sha256"] == ds.info["sha256"]
    docs = D.load("text", seq_len=16, max_bytes=20_000, docstrings_only=True)
    import ast

    doc = ast.get_docstring(ast.parse(first.decode()))
    stream = decode(np.concatenate([docs.train["x"].ravel(), docs.test["x"].ravel()]))
    assert stream.startswith(doc) and "\nimport " not in stream  # prose, not code


def test_text_from_a_directory(tmp_path):
    (tmp_path / "b.txt").write_text("world " * 40)
    (tmp_path / "a.txt").write_text("hello " * 40)
    (tmp_path / "skip.md").write_text("#" * 1000)
    ds = D.load("text", root=tmp_path, seq_len=8, test_fraction=0.25)
    parts = D.partition(ds.train["y"], 3, "iid", key=0)  # 2-D targets: iid works
    _check_partition(parts, len(ds.train["y"]))
    with pytest.raises(ValueError, match="1-D integer class labels"):
        D.partition(ds.train["y"], 3, "dirichlet")
    assert decode(ds.train["x"][0]) == "hello he" and "#" not in decode(ds.test["x"].ravel())
    with pytest.raises(ValueError, match="corpus directory .* not found"):
        D.load("text", root=tmp_path / "none")


# ---------------------------------------------------------------------------------- partitions
def _check_partition(parts, n):
    allidx = np.concatenate(parts)
    assert len(allidx) == n and len(np.unique(allidx)) == n  # disjoint and covering


def test_iid_partition(digits):
    y = digits.train["y"]
    parts = D.partition(y, 8, "iid", key=jax.random.key(0))
    _check_partition(parts, len(y))
    assert {len(p) for p in parts} <= {len(y) // 8, len(y) // 8 + 1}
    again = D.partition(y, 8, "iid", key=jax.random.key(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = D.partition(y, 8, "iid", key=jax.random.key(1))
    assert not np.array_equal(parts[0], other[0])
    # iid label histograms only deviate by sampling noise: E|q_wc - q_c| <= sqrt(q_c(1-q_c)/n_w)
    q = np.bincount(y) / len(y)
    bound = 0.5 * np.sum(np.sqrt(q * (1 - q) / (len(y) // 8)))
    assert D.mean_tv_distance(y, parts) < 1.5 * bound
    with pytest.raises(ValueError, match="unknown partition scheme 'noniid'; valid: iid, dirichlet"):
        D.partition(y, 8, "noniid")


def test_dirichlet_partition_skew_decreases_with_alpha(digits):
    y = digits.train["y"]
    tv = {}
    for alpha in (0.05, 0.3, 3.0, 300.0):
        parts = D.partition(y, 8, "dirichlet", alpha=alpha, key=jax.random.key(7), min_size=20)
        _check_partition(parts, len(y))
        assert min(len(p) for p in parts) >= 20
        tv[alpha] = D.mean_tv_distance(y, parts)
    assert tv[0.05] > tv[0.3] > tv[3.0] > tv[300.0]
    assert tv[0.05] > 0.6  # most workers see few classes
    q = np.bincount(y) / len(y)
    assert tv[300.0] < 0.5 * np.sum(np.sqrt(q * (1 - q) / (len(y) // 8)))  # ~ iid
    a = D.partition(y, 8, "dirichlet", alpha=0.1, key=5)
    b = D.partition(y, 8, "dirichlet", alpha=0.1, key=5)
    assert all(np.array_equal(p, r) for p, r in zip(a, b))
    hist = D.label_histograms(y, a)
    assert hist.shape == (8, 10) and np.allclose(hist.sum(1), 1)
    with pytest.raises(ValueError, match="could not give each of 8 workers >= 187"):
        D.partition(y, 8, "dirichlet", alpha=0.01, key=0, min_size=187, max_tries=3)
    with pytest.raises(ValueError, match="1-D integer class labels"):
        D.partition(np.zeros(100, np.float32), 4, "dirichlet")


def test_shard_partition(digits):
    y = digits.train["y"]
    parts = D.partition(y, 10, "shards", key=0, shards_per_worker=2)
    _check_partition(parts, len(y))
    assert max(len(np.unique(y[p])) for p in parts) <= 4  # two shards, each spans <= 2 labels


# -------------------------------------------------------------------------------------- batcher
def test_batcher_rows_come_from_each_workers_partition(digits):
    parts = D.partition(digits.train["y"], 4, "dirichlet", alpha=0.5, key=0, min_size=20)
    it = D.Batcher(digits.train, parts, 32, jax.random.key(0))
    for _ in range(3):
        idx = it.indices()
        for w in range(4):
            assert set(idx[w * 8 : (w + 1) * 8]) <= set(parts[w])
    batch = it.next()
    assert batch["x"].shape == (32, 8, 8, 1) and batch["y"].shape == (32,)
    with pytest.raises(ValueError, match="global batch 30 is not divisible by 4 workers"):
        D.Batcher(digits.train, parts, 30, jax.random.key(0))


def test_batcher_epochs_cover_and_reshuffle():
    data = {"x": np.arange(40.0)[:, None], "y": np.arange(40)}
    parts = [np.arange(0, 24), np.arange(24, 40)]  # sizes 24 and 16
    it = D.Batcher(data, parts, 8, key=3)
    seen = [it.indices() for _ in range(6)]  # 24 rows of each worker
    w0 = np.concatenate([s[:4] for s in seen])
    assert sorted(w0) == list(range(24))  # one full epoch, no repeats
    w1 = np.concatenate([s[4:] for s in seen])
    assert sorted(w1[:16]) == list(range(24, 40)) and sorted(w1[16:]) != list(w1[16:])
    assert not np.array_equal(w1[:8], w1[16:24])  # a fresh permutation
    assert it.epochs == pytest.approx([1.0, 1.5])
    tiny = D.Batcher(data, [np.arange(3), np.arange(3, 40)], 16, key=0)  # partition < b
    idx = tiny.indices()[:8]
    assert set(idx) == {0, 1, 2}


def test_batcher_resume_gives_identical_batches(digits):
    parts = D.partition(digits.train["y"], 4, "dirichlet", alpha=0.3, key=1, min_size=10)
    a = D.Batcher(digits.train, parts, 64, jax.random.key(11))
    for _ in range(9):
        a.next()
    state = json.loads(json.dumps(a.state_dict()))  # survives a JSON checkpoint
    expected = [a.next() for _ in range(12)]
    b = D.Batcher(digits.train, parts, 64, jax.random.key(999))  # the saved seed wins
    b.load_state_dict(state)
    for e in expected:
        got = b.next()
        np.testing.assert_array_equal(got["x"], e["x"])
        np.testing.assert_array_equal(got["y"], e["y"])
    assert b.step == a.step == 21
    c = D.Batcher(digits.train, parts, 32, jax.random.key(11))
    with pytest.raises(ValueError, match="Batcher state is for 4 partitions"):
        c.load_state_dict(state)
