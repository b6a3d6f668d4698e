"""Byte accounting formulas and the HLO collective parser (synthetic HLO text)."""

import numpy as np
import pytest

from cconv.comm import Collective, hlo, merge, total_traffic, traffic

HLO = """\
HloModule jit_step, entry_computation_layout={(f32[1,10]{1,0})->f32[]}

%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %add = f32[] add(%a, %b)
}

ENTRY %main.0_spmd (param: f32[1,10], /*index=1*/p2: s32[10]) -> (f32[10], s32[10]) {
  %all-reduce = (f32[10]{0}, f32[]) all-reduce(%x, %y), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%region_0.1
  %ag = f32[4,6]{1,0} all-gather(%z), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
  %cp = (f32[5]{0}, s32[5]{0}) collective-permute(%v, %i), channel_id=3, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  %cps = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(%w), channel_id=4, source_target_pairs={{1,0}}
  %cpd = f32[8]{0} collective-permute-done(%cps)
  %ars = bf16[16]{0} all-reduce-start(%q), channel_id=5, replica_groups={{0,1},{2,3}}, to_apply=%region_0.1
  %ard = bf16[16]{0} all-reduce-done(%ars)
  %ags = (u8[3]{0}, u8[12]{0}) all-gather-start(%s), channel_id=6, replica_groups={{0,1,2,3}}, dimensions={0}
  %agd = u8[12]{0} all-gather-done(%ags)
  ROOT %t = (f32[10]{0}, s32[10]{0}) tuple(%a, %b)
}
"""


def test_parser_reads_tuple_shapes_groups_pairs_and_async_forms():
    cs = hlo.collectives(HLO)
    assert [c.op for c in cs] == [
        "all-reduce",
        "all-gather",
        "collective-permute",
        "collective-permute",
        "all-reduce",
        "all-gather",
    ]
    assert all(c.entry for c in cs)
    assert cs[0].shapes == (("f32", (10,)), ("f32", ())) and cs[0].nbytes == 44
    assert cs[1].groups == ((0, 1, 2, 3),) and cs[1].nbytes == 96
    assert cs[2].nbytes == 40 and cs[2].pairs == ((0, 1), (1, 0), (2, 3), (3, 2))
    assert cs[3].nbytes == 32 and cs[3].pairs == ((1, 0),)  # -start: operand only, once
    assert cs[4].nbytes == 32 and cs[4].groups == ((0, 1), (2, 3))
    assert cs[5].nbytes == 12  # all-gather-start: the result
    sent, recv = hlo.per_device_traffic(HLO, 4)
    ring = 2 * 3 / 4 * 44
    want_sent = ring + 3 * 96 / 4 + 40 + 32 * np.array([0, 1, 0, 0]) + 32 + 3 * 12 / 4
    want_recv = ring + 3 * 96 / 4 + 40 + 32 * np.array([1, 0, 0, 0]) + 32 + 3 * 12 / 4
    np.testing.assert_allclose(sent, want_sent)
    np.testing.assert_allclose(recv, want_recv)


def test_collectives_in_loops_are_refused_unless_allowed():
    text = HLO.replace(
        "%region_0.1 (a: f32[], b: f32[]) -> f32[] {\n",
        "%body (a: f32[], b: f32[]) -> f32[] {\n  %x = f32[3]{0} all-reduce(%a), replica_groups={{0,1}}, to_apply=%r\n",
    )
    with pytest.raises(ValueError, match="inside computation 'body'"):
        hlo.per_device_traffic(text, 4)
    assert hlo.per_device_traffic(text, 4, allow_nested=True)[0][0] > 0


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_traffic_formulas(p):
    d = 100.0
    s, r = traffic(Collective("allreduce", d), p)
    assert np.allclose(s, 2 * (p - 1) / p * d) and np.allclose(r, s)
    s, r = traffic(Collective("allgather", d, count=2), p)
    assert np.allclose(s, 2 * (p - 1) * d)
    s, r = traffic(Collective("recursive_doubling", d), p)
    assert np.allclose(s, np.log2(p) * d)
    s, r = traffic(Collective("ps_push", d), p)
    assert s[0] == 0 and np.all(s[1:] == d) and r[0] == (p - 1) * d and np.all(r[1:] == 0)
    s, r = traffic(Collective("ps_pull", d), p)
    assert s[0] == (p - 1) * d and np.all(r[1:] == d) and r[0] == 0
    cs = [Collective("allreduce", d), Collective("allreduce", d), Collective("allreduce", 4.0, control=True)]
    assert merge(cs) == [Collective("allreduce", d, 2), Collective("allreduce", 4.0, 1, True)]
    assert np.allclose(total_traffic(cs, p, control=False)[0], 2 * traffic(cs[0], p)[0])


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="valid: allreduce"):
        traffic(Collective("gossip", 1.0), 4)
