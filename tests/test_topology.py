"""Gossip topologies (cconv.comm.topology) and their theory (cconv.theory.gossip): mixing matrices,
spectral gaps against numpy, the permutation exchange under shard_map and vmap, CHOCO's gamma*,
and the `cconv plan --gossip` rows."""

import math

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from cconv.comm import topology as T
from cconv.comm.accounting import Collective, total_traffic
from cconv.comm.backend import MeshComm
from cconv.theory import gossip as G

NAMES = ("ring", "torus", "exponential", "complete")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8, 9, 12])
def test_mixing_is_symmetric_doubly_stochastic_and_mixes(name, p):
    m = T.get(name, p)
    W = m.W
    assert np.allclose(W, W.T) and np.all(W >= 0)
    assert np.allclose(W.sum(0), 1) and np.allclose(W.sum(1), 1)
    lam = np.sort(np.abs(np.linalg.eigvals(W)))[::-1]
    assert lam[0] == pytest.approx(1.0) and m.gap == pytest.approx(1 - lam[1], abs=1e-12) and m.gap > 0
    # the permutations reach exactly the graph's edges, each once
    reached = np.zeros((p, p))
    for src, w in zip(m.perms, m.weights):
        assert sorted(src) == list(range(p)) and src != tuple(range(p))  # full, not the identity
        reached[np.arange(p), list(src)] += w
    assert np.allclose(reached + np.diag(np.diag(W)), W)


@pytest.mark.parametrize("p", range(2, 17))
def test_ring_gap_closed_form_matches_eigenvalues(p):
    W = T.get("ring", p).W
    lam = np.sort(np.abs(np.linalg.eigvals(W)))[::-1]
    assert T.ring_gap(p) == pytest.approx(1 - lam[1], abs=1e-12)
    if p >= 3:  # MH weights on a ring: 1/3 everywhere
        assert np.allclose(np.diag(W), 1 / 3) and W[0, 1] == pytest.approx(1 / 3)
    if p >= 4:
        assert T.ring_gap(p) == pytest.approx(2 / 3 * (1 - math.cos(2 * math.pi / p)))


def test_messages_per_worker():
    assert [T.get("ring", p).messages for p in (2, 3, 8, 64)] == [1, 2, 2, 2]  # independent of P >= 3
    assert T.get("torus", 16).messages == 4 and T.get("torus", 16).name == "torus4x4"
    assert T.get("torus", 8).name == "torus2x4" and T.get("torus", 8).messages == 3  # up == down for 2 rows
    assert T.get("exponential", 8).messages == 5  # +-1, +-2, 4
    assert T.get("complete", 8).messages == 7 and np.allclose(T.get("complete", 8).W, 1 / 8)
    assert T.get("torus", 6, torus=[2, 3]).name == "torus2x3"


def test_metropolis_hastings_weights():
    W = T.metropolis_hastings([[1], [0, 2, 3], [1], [1]])  # a star around rank 1
    assert W[0, 1] == pytest.approx(1 / 4) and W[0, 0] == pytest.approx(3 / 4) and W[1, 1] == pytest.approx(1 / 4)


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(name="ring", workers=1), "at least 2 workers"),
        (dict(name="star", workers=4), "unknown topology"),
        (dict(name="torus", workers=8, torus=[3, 3]), "does not factor"),
        (dict(name="torus", workers=8, torus=[2]), "pair"),
        (dict(name="matrix", workers=2), "needs mixing"),
        (dict(name="matrix", workers=2, mixing=[[0.5, 0.6], [0.6, 0.5]]), "doubly stochastic"),
        (dict(name="matrix", workers=2, mixing=[[0.5, 0.4], [0.6, 0.5]]), "symmetric"),
        (dict(name="matrix", workers=2, mixing=[[0.0, 1.0], [1.0, 0.0]]), "does not mix"),
        (dict(name="matrix", workers=4, mixing=np.kron(np.eye(2), np.full((2, 2), 0.5))), "does not mix"),
        (dict(name="matrix", workers=3, mixing=np.eye(2)), "3 x 3"),
        (dict(name="matrix", workers=2, mixing=[[1.5, -0.5], [-0.5, 1.5]]), ">= 0"),
        (dict(name="ring", workers=4, torus=[2, 2]), "takes no torus"),
    ],
)
def test_bad_topologies_one_line(kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        T.get(**kw)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- exchange


def _mesh(p):
    return Mesh(np.array(jax.devices()[:p]), ("w",))


MIXINGS = [
    ("ring", 8, {}),
    ("torus", 8, {}),
    ("torus", 6, {"torus": [2, 3]}),
    ("exponential", 8, {}),
    ("complete", 4, {}),
    ("matrix", 4, {"mixing": [[0.5, 0.25, 0, 0.25], [0.25, 0.5, 0.25, 0], [0, 0.25, 0.5, 0.25], [0.25, 0, 0.25, 0.5]]}),
]


@pytest.mark.parametrize("name, p, kw", MIXINGS, ids=[f"{n}{p}" for n, p, _ in MIXINGS])
def test_mix_under_shard_map_is_w_times_x(name, p, kw):
    m = T.get(name, p, **kw)
    x = jax.random.normal(jax.random.PRNGKey(0), (p, 5))
    ledgers = []

    def body(xi):
        comm = MeshComm("w", p)
        out = T.mix(comm, m, {"a": xi[0]})["a"][None]
        ledgers.append(comm.ledger)
        return out

    got = jax.jit(jax.shard_map(body, mesh=_mesh(p), in_specs=P("w"), out_specs=P("w")))(x)
    np.testing.assert_allclose(np.asarray(got), m.W @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-6)
    assert ledgers[0] == [Collective("permute", 20.0)] * m.messages
    sent, recv = total_traffic(ledgers[0], p)
    assert np.all(sent == 20.0 * m.messages) and np.all(recv == sent)


def test_mix_under_vmap_with_an_axis_name():
    """Full permutations: jax.vmap's ppermute (the vmap launcher) needs every rank to be a target."""
    p = 8
    m = T.get("exponential", p)
    x = jax.random.normal(jax.random.PRNGKey(1), (p, 3))
    got = jax.jit(jax.vmap(lambda xi: T.mix(MeshComm("w", p), m, xi), axis_name="w"))(x)
    np.testing.assert_allclose(np.asarray(got), m.W @ np.asarray(x, np.float64), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- theory


def test_choco_gamma_and_rate():
    th = G.choco("ring", 8)  # no compression: omega = 1
    assert th.omega == 1.0 and th.gap == pytest.approx(T.ring_gap(8))
    assert 0 < th.gamma <= 1 and th.rate == pytest.approx(th.gap**2 / 82)
    lam = np.linalg.eigvalsh(T.get("ring", 8).W)
    assert th.beta == pytest.approx(np.max(np.abs(1 - lam)))
    with pytest.raises(ValueError, match="spectral gap"):
        G.choco_gamma(0.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="omega"):
        G.choco_gamma(0.5, 1.0, 1.5)


def test_choco_gossip_at_gamma_star_converges_at_least_at_the_theorem_rate():
    """CHOCO-Gossip (Koloskova et al. 2019, Alg. 1) on a ring with a deterministic top-k (delta = k/d,
    worst case) at gamma*: the consensus error e_t = sum_i ||x_i - x_bar||^2 + ||x_i - x_hat_i||^2
    shrinks at least as fast as (1 - rho^2 omega / 82)^t (Theorem 2)."""
    p, d, k = 8, 50, 5
    m = T.get("ring", p)
    omega = k / d
    gamma = G.choco_gamma(m.gap, m.beta, omega)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(p, d))
    xbar = x.mean(0)
    hat = np.zeros_like(x)

    def topk(v):
        out = np.zeros_like(v)
        idx = np.argsort(-np.abs(v), axis=1)[:, :k]
        np.put_along_axis(out, idx, np.take_along_axis(v, idx, 1), 1)
        return out

    def err():
        return np.sum((x - xbar) ** 2) + np.sum((x - hat) ** 2)

    e0, rate = err(), 1 - m.gap**2 * omega / 82
    for t in range(1, 201):
        hat = hat + topk(x - hat)
        x = x + gamma * (m.W @ hat - hat)
        assert err() <= e0 * rate**t * (1 + 1e-9)
    assert np.allclose(x.mean(0), xbar)  # gossip preserves the average


def test_gossip_rows_ring_bytes_do_not_grow_with_p():
    from cconv.theory import network as N

    net = N.get("10GbE")
    for p in (4, 16, 64):
        rows = {r.name: r for r in G.gossip_rows(4e6, p, net)}
        assert rows["ring"].messages == 2 and rows["ring"].sent_bytes == 8e6
        assert rows["allreduce"].sent_bytes == pytest.approx(2 * (p - 1) / p * 4e6)
        assert rows["ring"].comm_s == pytest.approx(2 * (net.alpha + 4e6 * net.beta))
        assert rows["ring"].gap == pytest.approx(T.ring_gap(p))
    big = G.gossip_rows(4e6, 10_000, net)
    assert [r.name for r in big] == ["allreduce", "ring"]  # no eigendecomposition of 10^4 x 10^4


def test_plan_cli_gossip_rows(capsys):
    from cconv.theory import plan_cli

    assert plan_cli.main(["--workload", "resnet50", "--workers", "16", "--network", "10GbE", "--gossip"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()}
    assert lines["ring"][1] == "2" and lines["torus"][1] == "4" and lines["complete"][1] == "15"
    assert lines["allreduce"][1] == "30"
    assert plan_cli.main(["--workload", "resnet50", "--workers", "16", "--network", "10GbE"]) == 0
    assert "exponential" not in capsys.readouterr().out  # only with --gossip


def test_theory_reads_the_compressor_entry():
    from cconv import compressors as C

    # any contractive registered compressor: omega is its delta; unbiased: 1/(1 + w)
    for e in C.entries():
        if e.theory is None:
            continue
        try:
            c = e.build()
        except (TypeError, ValueError):
            continue
        try:
            w = G.compression_quality(c, (64,))
        except ValueError as err:
            assert "not a contraction" in str(err) or "no constants" in str(err)
            continue
        assert 0 < w <= 1
    assert G.compression_quality(None, (64,)) == 1.0
