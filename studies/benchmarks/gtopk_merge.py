"""gTop-k's merge: the merge path (``cconv.comm.gtopk.merge_sorted_topk``) against the sort-based
merge it replaced, as training-step time and as a ratio to the dense step (issue 16, section 4).

    .venv/bin/python studies/benchmarks/gtopk_merge.py [--workers 8] [--ratio 0.01] [--repeats 9]

Three trainers on the same problem as part (b) of run.py (MLP on 28x28 inputs, global batch 256,
P simulated devices): dense, gTop-k + EF with the merge path, gTop-k + EF with the old merge
(``merge_sorted_topk`` replaced by the argsort version while that trainer traces).  Timed in
interleaved rounds (a block of steps of each, ``--repeats`` times); medians, and the spread of
the per-round ratios.  Also the merge alone, jitted, at k = ratio * d.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def merge_by_sort(va, ia, vb, ib, k):
    """The merge before issue 16 (``cconv.comm.gtopk.merge_topk_by_sort``)."""
    from cconv.comm.gtopk import merge_topk_by_sort

    return merge_topk_by_sort(va, ia, vb, ib, k)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.workers}".strip()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import jax
    import numpy as np
    import optax
    from run import _engine_cfg, _problem, _steps

    from cconv.comm import gtopk as G
    from cconv.engine import build

    spec, loss, b = _problem("mlp", 256)

    def prepared(cfgspec):
        tr = build(
            loss, spec.params, optax.sgd(0.01, momentum=0.9), _engine_cfg(args.workers, cfgspec), spec.model_state
        )
        state = _steps(tr, tr.init(), b, 2)  # traced and compiled here
        return lambda: _steps(tr, state, b, args.steps)

    gt = dict(compressor=("topk", {"ratio": args.ratio}), memory="ef", collective="gtopk")
    runs = {"dense": prepared(dict(compressor="none")), "merge path": prepared(gt)}
    new_merge = G.merge_sorted_topk
    G.merge_sorted_topk = merge_by_sort
    try:
        runs["sort (before)"] = prepared(gt)
    finally:
        G.merge_sorted_topk = new_merge
    times = {k: [] for k in runs}
    for _ in range(args.repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) / args.steps)
    out = {"workers": args.workers, "ratio": args.ratio, "repeats": args.repeats, "rows": {}}
    for k in ("merge path", "sort (before)"):
        per_round = [t / d for t, d in zip(times[k], times["dense"])]
        out["rows"][k] = {
            "step_ms": 1e3 * statistics.median(times[k]),
            "ratio_to_dense": statistics.median(per_round),
            "ratio_min": min(per_round),
            "ratio_max": max(per_round),
        }
    after_before = [a / s for a, s in zip(times["merge path"], times["sort (before)"])]
    out["dense_step_ms"] = 1e3 * statistics.median(times["dense"])
    out["after_over_before"] = statistics.median(after_before)
    out["after_over_before_range"] = (min(after_before), max(after_before))
    print(f"P={args.workers}, top-k {args.ratio:g} + EF, dense {out['dense_step_ms']:.2f} ms/step")
    for k, r in out["rows"].items():
        print(
            f"  gTop-k, {k:14s} {r['step_ms']:8.2f} ms/step  {r['ratio_to_dense']:.2f}x dense "
            f"(rounds {r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        )
    lo, hi = out["after_over_before_range"]
    print(f"  step time after / before: {out['after_over_before']:.3f} (rounds {lo:.3f}-{hi:.3f})")
    # the merge alone
    d = sum(int(x.size) for x in jax.tree.leaves(spec.params))
    k = max(1, int(args.ratio * d))
    rng = np.random.default_rng(0)
    ia, ib = (np.sort(rng.choice(d, k, replace=False)).astype(np.int32) for _ in range(2))
    va, vb = (rng.normal(size=k).astype(np.float32) for _ in range(2))
    fns = {
        "merge path": jax.jit(lambda a, i, b_, j: G.merge_sorted_topk(a, i, b_, j, k)),
        "sort (before)": jax.jit(lambda a, i, b_, j: merge_by_sort(a, i, b_, j, k)),
    }
    mt = {n: [] for n in fns}
    for f in fns.values():
        jax.block_until_ready(f(va, ia, vb, ib))
    for _ in range(args.repeats):
        for n, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(20):
                r = f(va, ia, vb, ib)
            jax.block_until_ready(r)
            mt[n].append((time.perf_counter() - t0) / 20)
    out["merge_alone_us"] = {n: 1e6 * statistics.median(v) for n, v in mt.items()}
    out["merge_k"] = k
    print(f"  the merge alone, k={k}: " + ", ".join(f"{n} {v:.1f} us" for n, v in out["merge_alone_us"].items()))
    return out


if __name__ == "__main__":
    main()
