"""Compression cost by implementation (cconv.theory.implementation): each cost term against
hand-computed values, the facts on the registry entries, and PowerSGD planned from tensor shapes."""

import math

import pytest

from cconv import compressors as C
from cconv.theory import cluster as CL
from cconv.theory import implementation as IM
from cconv.theory import planner as PL
from cconv.theory import predict as PR
from cconv.theory import profiles as P
from cconv.theory.devices import Device
from cconv.theory.schedule import compress as CC

# round numbers: a read floor of n elements is 4n / 1e9 s, one op 10 us, a sort 10 floors, staging 1 GB/s
DEV = Device("toy", 1e12, 1e9, 5e-6)
IMPL = IM.Implementation("toy", True, op_s=1e-5, sort_passes=10.0, host_bw=1e9, compress_vectors=True)  # as GRACE


def test_decodes_per_collective():
    assert IM.decodes("allgather", 8) == 8
    assert IM.decodes("recursive_doubling", 8) == 3
    assert IM.decodes("recursive_doubling", 5) == 3  # ceil(log2 5)
    assert IM.decodes("recursive_doubling", 1) == 1
    assert IM.decodes("allreduce", 8) == 1


def test_selection_costs_in_read_floors():
    floor = 4 * 1000 / 1e9
    assert IM.select_s(None, 1000, IMPL, DEV) == 0.0
    assert IM.select_s("sort", 1000, IMPL, DEV) == pytest.approx(10 * floor)
    assert IM.select_s("radix", 1000, IMPL, DEV) == pytest.approx(5 * floor)  # 4 digit passes + 1
    assert IM.select_s("compare", 1000, IMPL, DEV) == pytest.approx(floor)
    assert IM.select_s("sample", 1000, IMPL, DEV) == pytest.approx(floor)
    with pytest.raises(ValueError, match="unknown selection"):
        IM.select_s("bogosort", 1000, IMPL, DEV)


def test_topk_compress_and_decompress_by_hand():
    """top-k's facts: 5 ops, 2 passes, a framework sort; decode 3 ops and 1 pass per payload."""
    c = C.get("topk", ratio=0.01)
    floor = 4 * 1000 / 1e9
    assert IM.compress_s(c, (10, 100), IMPL, DEV) == pytest.approx(5 * 1e-5 + 2 * floor + 10 * floor)
    assert IM.decompress_s(c, (1000,), IMPL, DEV, 4) == pytest.approx(4 * (3 * 1e-5 + 1 * floor))


def test_powersgd_matmuls_by_hand():
    """P = M Q and Q = M^T P (2 n m r each), Gram-Schmidt 2 n r^2; decode P Q^T (2 n m r); vectors
    are sent dense (no FLOPs)."""
    c = C.get("powersgd", rank=2)
    n, m, r = 64, 32, 2
    floor = 4 * n * m / 1e9
    comp = 6 * 1e-5 + 1 * floor + (4 * n * m * r + 2 * n * r * r) / 1e12
    assert IM.compress_s(c, (n, m), IMPL, DEV) == pytest.approx(comp)
    assert IM.decompress_s(c, (n, m), IMPL, DEV, 1) == pytest.approx(3 * 1e-5 + floor + 2 * n * m * r / 1e12)
    assert IM.compress_s(c, (64,), IMPL, DEV) == pytest.approx(6 * 1e-5 + 4 * 64 / 1e9)


def test_powersgd_matrix_view_by_framework_layout():
    """Framework PowerSGD factorises (shape[0], rest) of the tensor as its framework lays it out
    (GRACE's ``tf.reshape(tensor, [tensor_shape[0], -1])``, PyTorch's hook ``tensor.view(shape[0], -1)``):
    on TensorFlow's (kh, kw, in, out) kernels that is (kernel height x rest), on PyTorch's (out, in, kh, kw)
    (out x rest); cconv's fused program keeps its own (rest x out) view; a compressor without a view is
    unchanged."""
    c = C.get("powersgd", rank=1)
    tf, pt, fused = IM.get("per-tensor"), IM.get("ddp-hook"), IM.get("fused")
    assert IM.get("mpi").layout == tf.layout == IM.TENSORFLOW and pt.layout == IM.PYTORCH
    assert IM.tensor_view(c, (3, 3, 64, 128), tf) == (3, 3 * 64 * 128)
    assert IM.tensor_view(c, (3, 3, 64, 128), pt) == (128, 64 * 3 * 3)
    assert IM.tensor_view(c, (3, 3, 64, 128), fused) == (3, 3, 64, 128)
    assert IM.tensor_view(c, (2048, 1000), tf) == (2048, 1000) and IM.tensor_view(c, (2048, 1000), pt) == (1000, 2048)
    assert IM.tensor_view(c, (64,), tf) == (64,)
    assert IM.tensor_view(C.get("topk", ratio=0.01), (3, 3, 64, 128), tf) == (3, 3, 64, 128)
    # the message bytes of one layer, by hand (rank 1, fp32): a 3x3 kernel sends P (3) and Q (3 * 64 * 128)
    # under TensorFlow's layout, P (128) and Q (576) under PyTorch's; a 1x1 kernel (1 x 8192: min(n, m) = 1
    # <= rank) goes dense, where cconv's own view factorises it into 64 + 128 values
    method = PL.all_methods()["powersgd"]

    def nbytes(shape, impl):
        d = math.prod(shape)
        return CC.layer_cost("l", 0.0, 0.0, d, method, c, 8, DEV, CC.load_bench(), (shape,), impl).nbytes

    assert nbytes((3, 3, 64, 128), tf) == 4 * (3 + 3 * 64 * 128)
    assert nbytes((3, 3, 64, 128), pt) == 4 * (128 + 576)
    assert nbytes((1, 1, 64, 128), tf) == 4 * 64 * 128
    assert nbytes((1, 1, 64, 128), fused) == 4 * (64 + 128)


def test_host_staging_by_hand():
    assert IM.staging_s(IMPL, "allgather", 1e6, 8) == pytest.approx((1e-3, 8e-3))  # P payloads come back
    assert IM.staging_s(IMPL, "allreduce", 1e6, 8) == pytest.approx((1e-3, 1e-3))  # their sum comes back
    assert IM.staging_s(IM.get("per-tensor"), "allgather", 1e6, 8) == (0.0, 0.0)  # stays on the GPU


def test_unpacked_codes_in_framework_implementations():
    """A framework tensor has no sub-byte dtype: signSGD's signs travel as bools (1 byte each)."""
    c = C.get("signsgd")
    wire = float(c.wire_bytes((1000,), "float32"))
    assert wire == 125
    assert IM.message_bytes(c, (1000,), wire, IM.get("fused")) == 125
    assert IM.message_bytes(c, (1000,), wire, IM.get("per-tensor")) == 1000
    topk = C.get("topk", ratio=0.1)  # values and indices: already whole words
    w = float(topk.wire_bytes((1000,), "float32"))
    assert IM.message_bytes(topk, (1000,), w, IM.get("mpi")) == w


def test_layer_cost_sums_its_tensors_and_stages_the_dense_gradient():
    table = PL.all_methods()
    shapes = ((10, 100), (100,))
    d = 1100
    floor = lambda n: 4 * n / 1e9  # noqa: E731
    c = C.get("topk", ratio=0.01)
    lc = CC.layer_cost("l", 0.0, 0.0, d, table["topk"], c, 4, DEV, {}, shapes, IMPL)
    wires = [float(c.wire_bytes(s, "float32")) for s in shapes]
    comp = sum(5 * 1e-5 + 12 * floor(math.prod(s)) + w / 1e9 for s, w in zip(shapes, wires))
    dec = sum(4 * (3 * 1e-5 + floor(math.prod(s))) + 4 * w / 1e9 for s, w in zip(shapes, wires))
    assert (lc.kind, lc.nbytes) == ("allgather", sum(wires))
    assert lc.compress_s == pytest.approx(comp)
    assert lc.decompress_s == pytest.approx(dec)
    ident = C.get(PL.identity_name())
    dense = CC.layer_cost("l", 0.0, 0.0, d, table[PL.identity_name()], ident, 4, DEV, {}, shapes, IMPL)
    assert (dense.compress_s, dense.decompress_s) == pytest.approx((4 * d / 1e9, 4 * d / 1e9))
    fused = CC.layer_cost("l", 0.0, 0.0, d, table[PL.identity_name()], ident, 4, DEV, {}, shapes, "fused")
    assert (fused.compress_s, fused.decompress_s) == (0.0, 0.0)


def test_unknown_implementation_is_one_line():
    with pytest.raises(
        ValueError, match="unknown implementation 'gpu'; valid: fused, per-tensor, mpi, ddp-hook, espresso$"
    ):
        IM.get("gpu")


def test_registry_refuses_a_bad_cost():
    entry = C.entry("signsgd")._replace(cost=C.Cost(select="quickselect"))
    with pytest.raises(ValueError, match="cost must be a Cost"):
        C.register("signsgd-bad-cost", entry)


def test_every_registered_compressor_has_cost_facts():
    for e in C.entries():
        assert isinstance(e.cost, C.Cost) and e.cost.compress_ops >= 0 and e.cost.decompress_passes >= 0


def test_profiles_carry_tensor_shapes_that_add_up():
    for name in P.names():
        prof = P.get(name)
        assert all(lay.shapes for lay in prof.layers), name
        assert sum(math.prod(s) for lay in prof.layers for s in lay.shapes) == prof.params
    assert len([s for lay in P.get("resnet50").layers for s in lay.shapes]) == 161  # torchvision's tensors
    with pytest.raises(ValueError, match="its shapes hold 6 elements, not grad_bytes / 4"):
        P.layer("x", 1.0, 2.0, 4 * 7, ((2, 3),))


@pytest.mark.slow
def test_powersgd_is_planned_per_tensor_on_a_cluster():
    """Issue 33's done-when: every row, PowerSGD included, with its rank-r traffic and its matmuls."""
    c = CL.parse("8x1", "NVLink", "10GbE", "v100")
    rows = PR.predict(c, "resnet50", ["none", "topk", "powersgd"], sweep={"ratio": [0.01], "rank": [1, 4]})
    by = {(r.method, r.setting): r for r in rows}
    dense = by[("none", "-")]
    r1, r4 = by[("powersgd", "rank=1")], by[("powersgd", "rank=4")]
    assert r1.bytes < r4.bytes < dense.bytes / 50
    slow = PR.predict(c, "resnet50", ["topk", "powersgd"], sweep={"ratio": [0.01], "rank": [1]}, implementation="mpi")
    fast = {r.method: r for r in rows}
    for r in slow:  # op by op through the host is slower than cconv's fused program
        assert r.compress_s > fast[r.method].compress_s


@pytest.mark.slow
def test_plan_cli_done_when_command(capsys):
    import json

    from cconv.theory import plan_cli

    argv = "--workload resnet50 --cluster 8x1 --network 10GbE --device v100 --implementation per-tensor "
    argv += "--methods none,topk,randomk,signsgd,powersgd --json"
    assert plan_cli.main(argv.split()) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["method"] for r in rows} == {"none", "topk", "randomk", "signsgd", "powersgd"}
    assert all(r["implementation"] == "per-tensor" for r in rows)


@pytest.mark.slow
def test_docs_example_and_constants_are_the_models(capsys):
    """docs/clusters.md's per-tensor example is what the command prints, its constants table and
    its claims about the fused run come from the code."""
    import pathlib
    import re

    from cconv.theory import plan_cli

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "clusters.md").read_text()
    block = re.search(r"\$ cconv plan --workload resnet50 --cluster 8x1 (.*?)\n```", doc, re.S).group(1)
    command, _, printed = block.partition("\n")
    command += " " + printed.split("\n", 1)[0]  # the command's continuation line
    printed = printed.split("\n", 1)[1]
    argv = ("--workload resnet50 --cluster 8x1 " + command.replace("\\", " ")).split()
    assert plan_cli.main(argv) == 0
    assert capsys.readouterr().out.strip() == printed.strip()
    constants = (f"{IM.OP_S * 1e6:.1f} us", f"| {IM.SORT_PASSES:.0f} |", f"{IM.HOST_BW / 1e9:.2f} GB/s")
    for text in (*constants, f"| `ROUND_S` | {IM.ROUND_S * 1e6:.1f} us |"):
        assert text in doc
    c = CL.parse("8x1", "NVLink", "10GbE", "v100")
    fused = PR.predict(
        c, "resnet50", ["none", "topk", "randomk", "signsgd", "powersgd"], sweep={"ratio": [0.01], "rank": [1]}
    )
    scal = {r.method: round(r.scaling_factor, 2) for r in fused}
    lo, hi = min(v for k, v in scal.items() if k != "none"), max(v for k, v in scal.items() if k != "none")
    assert f"scaling {lo:.2f}-{hi:.2f} against {scal['none']:.2f}" in " ".join(doc.split())


# ---------------------------------------------------------------- ddp-hook: framework ops per DDP bucket

MIB = 1024 * 1024
DDP = IMPL._replace(
    name="toy-ddp", host_bw=0.0, bucket_limits=(400.0, 900.0), compress_vectors=False
)  # bytes: first bucket, then the rest


def test_ddp_bucket_assignment_by_hand():
    """PyTorch's compute_bucket_assignment_by_size: add the tensor, close the bucket once it holds
    >= its limit (1 MiB for the first, 25 MiB after), the remainder is the last bucket."""
    sizes = [x * MIB for x in (0.5, 0.6, 10, 20, 1, 30, 2)]
    assert IM.buckets(sizes) == [(0, 1), (2, 3), (4, 5), (6,)]
    assert IM.buckets([MIB, 25 * MIB, 24 * MIB, MIB]) == [(0,), (1,), (2, 3)]  # exactly the limit closes it
    assert IM.buckets([100 * MIB, 0.5 * MIB]) == [(0,), (1,)]  # a tensor over the limit is its own bucket
    assert IM.DDP_BUCKET_LIMITS == (1048576, 26214400)  # PyTorch's kDefaultFirstBucketBytes, kDefaultBucketBytesCap
    assert IM.get("ddp-hook").bucket_limits == IM.DDP_BUCKET_LIMITS
    assert IM.get("ddp-hook").op_s == IM.OP_S and IM.get("ddp-hook").host_bw == 0.0  # no new constant
    with pytest.raises(ValueError, match="bucket limits must be positive"):
        IM.buckets([1.0], (0.0,))


def _toy_profile():
    """Backprop order; tensors in reverse registration order: head's bias (80 B) then kernel (800 B),
    pool none, mid's kernel (800 B), stem's second (120 B) then first (400 B) tensor."""
    layers = [
        ("head", 1e9, 2e9, 4 * 220, ((10, 20), (20,))),
        ("pool", 3e9, 3e9, 0.0, ()),
        ("mid", 4e9, 8e9, 4 * 200, ((50, 4),)),
        ("stem", 5e9, 5e9, 4 * 130, ((100,), (30,))),
    ]
    return P.make("toy", layers, 8)


def test_bucket_layers_by_hand():
    """Limits 400 B then 900 B: {head's 80 + 800} closes at 880 >= 400; {mid's 800 + stem's 120}
    at 920 >= 900; stem's 400 B remain.  A layer's backward belongs to the bucket of its first
    tensor (stem's to bucket 1, which it closes), the parameterless pool to the next bucket filled."""
    got = CC.bucket_layers(_toy_profile(), DDP.bucket_limits)
    assert [(b.layers, b.shapes) for b in got] == [
        ((0,), ((20,), (10, 20))),
        ((1, 2, 3), ((50, 4), (30,))),
        ((), ((100,),)),
    ]
    assert [b.owners for b in got] == [(0, 0), (2, 3), (3,)]


def test_ddp_hook_charges_ops_once_per_bucket_by_hand():
    """top-k on 4 workers (all-gather: 4 decodes) per bucket of n elements: 5 t_op + 2 F(n) + a
    sort of 10 F(n); decode 4 x (3 t_op + F(n)); one message of the flat bucket; compute of the
    bucket's layers.  Per tensor the same gradient pays 5 operations for each of its 5 tensors."""
    prof = _toy_profile()
    c = C.get("topk", ratio=0.1)
    lcs = CC.layer_costs(prof, "topk", 4, DEV, hparams={"ratio": 0.1}, bench={}, implementation=DDP)
    floor = lambda n: 4 * n / 1e9  # noqa: E731
    assert [lc.name for lc in lcs] == ["bucket0:head..head", "bucket1:pool..stem", "bucket2:-"]
    for lc, n in zip(lcs, (220, 230, 100)):
        assert lc.compress_s == pytest.approx(5 * 1e-5 + 12 * floor(n))
        assert lc.decompress_s == pytest.approx(4 * (3 * 1e-5 + floor(n)))
        assert (lc.kind, lc.nbytes) == ("allgather", float(c.wire_bytes((n,), "float32")))
    compute = [t for lc in lcs for t in (lc.fwd_s, lc.bwd_s)]
    assert compute == pytest.approx([1e-3, 2e-3, 12e-3, 16e-3, 0.0, 0.0])  # pool, mid and stem in bucket 1
    per = CC.layer_costs(
        prof, "topk", 4, DEV, hparams={"ratio": 0.1}, bench={}, implementation=IMPL._replace(host_bw=0)
    )
    ops = lambda ls: sum(lc.compress_s for lc in ls) - sum(12 * floor(n) for n in (220, 230, 100))  # noqa: E731
    assert (ops(lcs), ops(per)) == pytest.approx((3 * 5 * 1e-5, 5 * 5 * 1e-5))  # launches: 3 buckets vs 5 tensors


def test_ddp_hook_dense_and_per_tensor_aggregations_by_hand():
    """The dense baseline sends each bucket (4 n bytes), no compression; PowerSGD's hook loops over
    the bucket's matrices (matmuls per matrix), its factors travel in the bucket's message with the
    bucket's vectors, all-reduced uncompressed and costing no compression (PyTorch's powerSGD_hook);
    a hook that compresses them too pays their operations."""
    prof = _toy_profile()
    dense = CC.layer_costs(prof, PL.identity_name(), 4, DEV, implementation=DDP)
    assert [(lc.nbytes, lc.compress_s, lc.decompress_s) for lc in dense] == [(880, 0, 0), (920, 0, 0), (400, 0, 0)]
    c = C.get("powersgd", rank=2)
    ps = CC.layer_costs(prof, "powersgd", 4, DEV, hparams={"rank": 2}, bench={}, implementation=DDP)
    assert ps[1].compress_s == pytest.approx(IM.compress_s(c, (50, 4), DDP, DEV))
    assert ps[1].decompress_s == pytest.approx(IM.decompress_s(c, (50, 4), DDP, DEV, 1))
    assert ps[1].nbytes == pytest.approx(sum(PL.payload_leaf_bytes(c, (50, 4))) + 4 * 30)
    assert (ps[2].nbytes, ps[2].compress_s, ps[2].decompress_s, ps[2].kind) == (400, 0, 0, "allreduce")
    every = CC.layer_costs(prof, "powersgd", 4, DEV, hparams={"rank": 2}, bench={}, implementation=IMPL._replace(
        host_bw=0.0, bucket_limits=DDP.bucket_limits))  # fmt: skip
    bucket1 = ((50, 4), (30,))
    assert every[1].compress_s == pytest.approx(sum(IM.compress_s(c, s, DDP, DEV) for s in bucket1))
    assert every[1].nbytes == pytest.approx(sum(sum(PL.payload_leaf_bytes(c, s)) for s in bucket1))


def test_ddp_hook_refuses_different_hyper_parameters_in_one_bucket():
    hp = [{"ratio": 0.1}, {"ratio": 0.1}, {"ratio": 0.01}, {"ratio": 0.1}]  # mid and stem share bucket 1
    with pytest.raises(ValueError, match="bucket 1 holds layers with different hyper-parameters"):
        CC.layer_costs(_toy_profile(), "topk", 4, DEV, hparams=hp, bench={}, implementation=DDP)


@pytest.mark.slow
def test_plan_cli_ddp_hook(capsys):
    """``cconv plan --implementation ddp-hook``: every row, bucketed elementwise codecs far cheaper
    than per tensor; PowerSGD runs the same operations per matrix either way, each holding the
    stream for a queued launch under ddp-hook (its FLOPs and passes unchanged)."""
    import json

    from cconv.theory import plan_cli

    rows = {}
    for impl in ("per-tensor", "ddp-hook"):
        argv = "--workload resnet50 --cluster 8x1 --network 10GbE --device v100 --implementation " + impl
        assert (
            plan_cli.main((argv + " --methods none,topk,signsgd,powersgd --ratios 0.01 --ranks 1 --json").split()) == 0
        )
        rows[impl] = {r["method"]: r for r in json.loads(capsys.readouterr().out)}
    assert {r["implementation"] for r in rows["ddp-hook"].values()} == {"ddp-hook"}
    for m in ("topk", "signsgd"):
        assert rows["ddp-hook"][m]["compress_s"] < rows["per-tensor"][m]["compress_s"] / 4
    queued, in_line = rows["ddp-hook"]["powersgd"]["compress_s"], rows["per-tensor"]["powersgd"]["compress_s"]
    assert 0 < queued < in_line


# ---------------------------------------------------------------- two-level compressed collective


def _two_level_net():
    """2 nodes x 4 GPUs: intra alpha 1 us, 1 ns/B; inter alpha 100 us, 10 ns/B."""
    from cconv.theory import network as N

    return N.Hierarchical("toy", N.Network("i", 1e-6, 1e-9), N.Network("e", 1e-4, 1e-8), 4)


def test_two_level_stages_by_hand():
    """Dense reduce-scatter in the node (3 x (1 us + d/4 ns)), the compressed 1/4 shares across the
    2 nodes with the NIC shared by 4 (all-gather: 1 x (100 us + n x 10 ns)), all-gather in the node."""
    from cconv.theory.schedule import arch as A

    arch = A.get("two-level", _two_level_net(), 8)
    assert arch.compression_scope == (0.25, 2)
    d, n = 8e6, 1e5
    intra = 3 * (1e-6 + d / 4 * 1e-9)
    stages = arch.stages("allgather", n, d)
    assert [t for _, t in stages] == pytest.approx([intra, 1e-4 + n * 1e-8, intra])
    ring = 2 * 1 * 1e-4 + 2 * 1 / 2 * n * 1e-8  # summable payloads: a ring all-reduce of the shares
    assert A.cost(arch, "allreduce", n, d) == pytest.approx(2 * intra + ring)
    dense = A.get("hierarchical", _two_level_net(), 8)  # a dense message is the hierarchical all-reduce
    assert A.cost(arch, "allreduce", d) == pytest.approx(A.cost(dense, "allreduce", d))


def test_two_level_compresses_a_share_and_decodes_the_nodes_payloads():
    """Each GPU runs the fused program on d/g elements and decodes N payloads (not P); framework
    ops: a 1/g share of the tensors' operations, N decodes each."""
    table = PL.all_methods()
    c = C.get("topk", ratio=0.01)
    bench = {"topk": (CC.Ratio(1.0, 3.0, 2.0),)}  # 3 and 2 read floors at every size
    full = CC.layer_cost("l", 0.0, 0.0, 8000, table["topk"], c, 8, DEV, bench)
    part = CC.layer_cost("l", 0.0, 0.0, 8000, table["topk"], c, 2, DEV, bench, share=0.25)
    floor = lambda n: 4 * n / 1e9  # noqa: E731
    assert (full.compress_s, full.decompress_s) == pytest.approx((3 * floor(8000) + 5e-6, 8 * 2 * floor(8000) + 5e-6))
    assert (part.compress_s, part.decompress_s) == pytest.approx((3 * floor(2000) + 5e-6, 2 * 2 * floor(2000) + 5e-6))
    assert part.nbytes == full.nbytes  # the node's shares together: the layer's compressed bytes
    pt = CC.layer_cost("l", 0.0, 0.0, 1000, table["topk"], c, 2, DEV, {}, ((1000,),), IMPL._replace(host_bw=0), 0.25)
    assert pt.compress_s == pytest.approx(0.25 * (5e-5 + 12 * floor(1000)))
    assert pt.decompress_s == pytest.approx(0.25 * 2 * (3e-5 + floor(1000)))
    with pytest.raises(ValueError, match="share must be in"):
        CC.layer_cost("l", 0.0, 0.0, 1000, table["topk"], c, 2, DEV, bench, share=0.0)


def test_predict_two_level_plans_the_compressed_exchange_across_nodes_only():
    c = CL.parse("2x4", "NVLink", "10GbE", "v100")
    flat, two = (
        PR.predict(
            c, "resnet50", ["none", "topk"], sweep={"ratio": [0.01]}, architecture=a, implementation="per-tensor"
        )
        for a in ("hierarchical", "two-level")
    )
    assert two[0].iteration_time_s == pytest.approx(flat[0].iteration_time_s)  # dense: the same all-reduce
    assert two[1].compress_s < flat[1].compress_s / 4  # 1/4 of the tensors' ops, 2 payloads decoded instead of 8
    assert two[1].iteration_time_s < flat[1].iteration_time_s


# ---------------------------------------------------------------- queued ops, data-dependent loops


def test_queued_ops_hold_the_stream_for_a_launch_by_hand():
    """PyTorch's eager ops are queued asynchronously: an op holds the compute stream for the
    device's launch cost (5 us here), not the host's dispatch (10 us); ddp-hook is queued,
    TensorFlow's per-tensor and MPI paths are not."""
    c = C.get("topk", ratio=0.01)
    floor = 4 * 1000 / 1e9
    queued = IMPL._replace(queued=True)
    assert queued.op_cost(DEV) == 5e-6 and IMPL.op_cost(DEV) == 1e-5
    assert IM.compress_s(c, (1000,), queued, DEV) == pytest.approx(5 * 5e-6 + 2 * floor + 10 * floor)
    assert IM.decompress_s(c, (1000,), queued, DEV, 4) == pytest.approx(4 * (3 * 5e-6 + floor))
    assert IM.get("ddp-hook").queued and not IM.get("per-tensor").queued and not IM.get("mpi").queued


def test_grace_dgc_rethreshold_rounds_by_hand():
    """GRACE's DGC loop on 64 half-normal magnitudes (count above t: round(128 (1 - Phi(t)))), K = 1,
    from the sample's median 0.674: counts 32, 26, 19, 12, 6, 3 are above 1.25 K (threshold x 1.25
    each), then 1 is within [0.8, 1.25]: 6 rounds.  Each round costs round_s and 5.5 passes."""
    import importlib
    from statistics import NormalDist

    dgc = importlib.import_module("cconv.compressors.dgc")
    assert dgc._loop_rounds(64, 1, NormalDist().inv_cdf(0.75)) == 6
    c = C.get("dgc", ratio=0.01)
    rounds = C.entry("dgc").cost.rounds(c, (1000,))
    floor = 4 * 1000 / 1e9
    once = 12 * 1e-5 + 3 * floor + floor  # 12 ops, 3 passes, the sampled threshold's pass
    got = IM.compress_s(c, (1000,), IMPL._replace(round_s=1e-4), DEV)
    assert rounds > 0 and got == pytest.approx(once + rounds * (1e-4 + 5.5 * floor))


def test_grace_dgc_loops_more_at_small_ratios():
    """Few sampled entries estimate the threshold and K's window holds few counts at 1 %: on
    ResNet-50's tensors the loop runs more than twice the rounds it runs at 10 %, 25 % or 50 %."""
    shapes = [s for lay in P.get("resnet50").layers for s in lay.shapes]
    rounds = C.entry("dgc").cost.rounds
    total = {r: sum(rounds(C.get("dgc", ratio=r), s) for s in shapes) for r in (0.01, 0.1, 0.25, 0.5)}
    assert all(total[0.01] > 2 * total[r] for r in (0.1, 0.25, 0.5)), total
