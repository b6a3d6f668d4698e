"""cconv benchmark suite (issue 6): one command, JSON + markdown table with the machine described.

    .venv/bin/python studies/benchmarks/run.py                 # everything, a few minutes
    .venv/bin/python studies/benchmarks/run.py --parts a --sizes 1e6,1e7

Parts
  (a) compress and decompress time of every registered compressor (also with its entropy-coded
      wire format where its schema offers one: positions="golomb", qsgd's coding="elias"; and of
      the selection primitives and of Golomb-Rice position coding alone, target <= 10x) on fp32
      vectors of 1e5, 1e6, 1e7, 2.5e7 elements, as ratios to the memory
      floor measured in the same rounds: a jitted ``sum(abs(x))`` (one read of x).  Also the
      "write floor" (a jitted ``2 * x``: one read + one freshly allocated fp32 output), which
      bounds any decompression that materialises the dense gradient;
  (b) training-step time of every engine configuration (dense, top-k + EF, sign, QSGD, ...) as
      a ratio to a hand-written ``jax.shard_map`` + ``lax.pmean`` step (``reference_step``) and to
      the engine's dense step, on 8 (simulated) devices, for the 1.3M-parameter MLP
      (256-1024-1024-10, global batch 1024: issue 16's targets), the small MLP and the CNN;
  (c) bytes per worker per step against P = 2, 4, 8, 16: dense allreduce, top-k allgather,
      gTop-k, parameter server (from the engine's static collective ledger, which the engine's
      tests check against the compiled HLO);
  (d) compile time of a step against the number of parameter tensors, layer-wise vs fused;
  (e) S = 5 seeds in one vmapped program against 5 separate runs;
  (v) ``launcher="vmap"`` (all P workers on one device) against ``shard_map`` on P (simulated)
      devices, the quickstart config's model and batch (MLP 64-128-10, global batch 256, P = 8).

Method: every function is jitted and run twice before timing (compile + warm-up); then
``--repeats`` rounds, each timing the floor and then the item back to back, and the ratio is
median(item) / median(floor) over the same rounds, so drifting machine load affects both alike.
Times are wall-clock medians with ``block_until_ready``.  Runs on any backend (the table records
which); on GPU the floors are device-memory passes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # jax and cconv are imported lazily (after the device flags are set)
    import jax

    from cconv.compressors import Bench, Compressor

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


TUNED_MALLOC = {  # glibc: keep freed blocks instead of unmapping them (see README, Performance)
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(16 * 2**30),
    "MALLOC_TOP_PAD_": str(256 * 2**20),
}


def _setup_devices(n: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


# --------------------------------------------------------------------------- timing


def _block(x):
    import jax

    return jax.block_until_ready(x)


def measure(fn, args, floor, floor_args, repeats: int) -> dict:
    """Median seconds of fn(*args) and of the floor over the same interleaved rounds."""
    for _ in range(2):
        _block(fn(*args))
    _block(floor(*floor_args))
    ts, fs = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        _block(floor(*floor_args))
        fs.append(time.perf_counter() - t)
        t = time.perf_counter()
        _block(fn(*args))
        ts.append(time.perf_counter() - t)
    t, f = statistics.median(ts), statistics.median(fs)
    return {"s": t, "floor_s": f, "ratio": t / f}


def median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        _block(fn())
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


# --------------------------------------------------------------------------- machine


def machine() -> dict:
    import jax
    import jaxlib

    from cconv import _native

    info = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()[:2]] + (["..."] if len(jax.devices()) > 2 else []),
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "native_topk_kernel": _native.available(),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }
    try:
        info["cpu"] = next(
            line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
        )
    except (OSError, StopIteration):
        info["cpu"] = platform.processor() or "unknown"
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    if jax.default_backend() == "gpu":
        info["gpu"] = jax.devices()[0].device_kind
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    return info


def loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


# --------------------------------------------------------------------------- (a) compressors


def bench_of(name: str) -> Bench:
    """A compressor's ``Bench`` from its registry entry (defaults and no target when it has none)."""
    from cconv import compressors as C

    return C.entry(name).bench or C.Bench()


def bench_hparams(name: str, ratio: float) -> dict:
    """Hyper-parameters each compressor is benchmarked with (``Entry.bench.hparams(ratio)``:
    sparsifiers at ``ratio``, threshold's tau for that ratio on N(0, 1) input, ...)."""
    return dict(bench_of(name).hparams(ratio))


def target_x(name: str) -> float | None:
    """Target of compress + decompress as a multiple of the read floor (``Entry.bench.target_x``)."""
    return bench_of(name).target_x


def bench_input(c: Compressor, x: jax.Array) -> jax.Array:
    """The tensor a compressor is timed on: a 2-D view (1000 rows) for an aggregation that is not
    one collective of a flat payload (PowerSGD's low-rank factors need a matrix), else ``x``."""
    if c.aggregation not in ("allreduce", "allgather") and x.size % 1000 == 0:
        return x.reshape(1000, -1)
    return x


CODED = (("positions", "golomb"), ("coding", "elias"))  # (hyper-parameter, entropy-coded value)
REPORT_ONLY = (("coding", "elias"),)  # coded variants timed without the compressor's target


def bench_cases(names, ratio) -> list[tuple[str, dict, str]]:
    """(name, hparams, label) timed in (a): every compressor at its ``Bench`` settings and, where
    its schema offers an entropy-coded wire format (``CODED``) that the settings allow, also with
    that format (same values, another message)."""
    from cconv import compressors as C

    out = []
    for name in names:
        hp = bench_hparams(name, ratio)
        out.append((name, hp, name))
        for param, value in CODED:
            if param in C.entry(name).schema.names and hp.get(param) != value:
                try:
                    C.get(name, **{**hp, param: value})
                except ValueError:  # not offered with these settings
                    continue
                out.append((name, {**hp, param: value}, f"{name} ({param}={value})"))
    return out


GOLOMB_TARGET_X = 10.0  # encode + decode of the positions, as a multiple of the read floor of x


def golomb_row(d, k, key, floor, x, rep, log=print) -> dict:
    """Golomb-Rice coding of k sorted positions in range(d) alone (``cconv.compressors.golomb``):
    encode and decode time against the read floor of the d-element fp32 vector, and the bits
    per position (encoded, and moved = the worst-case buffer)."""
    import jax

    from cconv.compressors import golomb, select

    idx = jax.jit(lambda kk: select.sample_k_distinct(kk, d, k))(key)  # uniform, ascending
    enc = jax.jit(lambda i: golomb.encode(i, d))
    dec = jax.jit(lambda s: golomb.decode(s, k, d)[0])
    stream = enc(idx)
    me = measure(enc, (idx,), floor, (x,), rep)
    md = measure(dec, (stream,), floor, (x,), rep)
    total = me["ratio"] + md["ratio"]
    row = {
        "d": d,
        "name": "golomb.encode + golomb.decode",
        "hparams": {"k": k},
        "compress_s": me["s"],
        "decompress_s": md["s"],
        "compress_x": me["ratio"],
        "decompress_x": md["ratio"],
        "total_x": total,
        "target_x": GOLOMB_TARGET_X,
        "meets_target": bool(total <= GOLOMB_TARGET_X),
        "encoded_bits_per_position": 8 * float(golomb.encoded_bytes(stream)) / k,
        "moved_bits_per_position": 8 * golomb.stream_bytes(k, d) / k,
        "primitive": True,
        "coding": True,
    }
    log(
        f"[a] d={d:.1e} golomb positions (k={k}): encode {me['ratio']:.2f}x decode {md['ratio']:.2f}x "
        f"total {total:.2f}x; {row['encoded_bits_per_position']:.2f} bits/position encoded, "
        f"{row['moved_bits_per_position']:.2f} moved"
    )
    return row


def part_a(sizes, repeats, ratio, names=None, log=print) -> dict:
    import jax
    import jax.numpy as jnp
    from jax import lax

    from cconv import compressors as C
    from cconv.compressors import select

    names = list(names or C.names())
    floor = jax.jit(lambda x: jnp.sum(jnp.abs(x)))
    write = jax.jit(lambda x: x * 2)
    rows, floors = [], []
    for d in sizes:
        x = jax.random.normal(jax.random.PRNGKey(0), (d,), jnp.float32)
        key = jax.random.PRNGKey(1)
        rep = repeats if d < 10**7 else max(3, repeats - 2)
        w = measure(write, (x,), floor, (x,), rep)
        floors.append({"d": d, "read_floor_s": w["floor_s"], "write_floor_s": w["s"], "write_over_read": w["ratio"]})
        log(f"[a] d={d:.1e} read floor {w['floor_s'] * 1e3:.3f} ms, write floor {w['ratio']:.2f}x")
        for name, hp, label in bench_cases(names, ratio):
            c = C.get(name, **hp)
            xin = bench_input(c, x)
            state = c.init(xin)
            comp = jax.jit(lambda v, k, s, c=c: c.compress(v, s, k)[0])
            payload = comp(xin, key, state)
            like = jax.ShapeDtypeStruct(xin.shape, xin.dtype)
            dec = jax.jit(lambda p, c=c, like=like: c.decompress(p, like))
            mc = measure(comp, (xin, key, state), floor, (x,), rep)
            md = measure(dec, (payload,), floor, (x,), rep)
            total = mc["ratio"] + md["ratio"]
            wr = (mc["s"] + md["s"]) / (mc["floor_s"] + md["floor_s"] * w["ratio"])  # vs read + write floor
            target = None if any(hp.get(p) == v for p, v in REPORT_ONLY) else target_x(name)
            row = {
                "d": d,
                "name": label,
                "compressor": name,
                "hparams": hp,
                "compress_s": mc["s"],
                "decompress_s": md["s"],
                "compress_x": mc["ratio"],
                "decompress_x": md["ratio"],
                "total_x": total,
                "total_vs_read_write_floor_x": wr,
                "target_x": target,
                "meets_target": None if target is None else bool(total <= target),
                "payload_bytes": C.payload_bytes(payload),
                "encoded_bytes": float(c.encoded_bytes(payload)),
            }
            rows.append(row)
            log(
                f"[a] d={d:.1e} {label:12s} compress {mc['ratio']:7.2f}x  decompress {md['ratio']:7.2f}x  "
                f"total {total:7.2f}x  (vs read+write floor {wr:5.2f}x)"
            )
        # selection primitives alone (the top-k family's and random-k's inner loops)
        k = max(1, math.ceil(ratio * d))
        prims = {
            "select.topk_indices": jax.jit(lambda v: select.topk_indices(v, k)),
            "lax.top_k(|x|)": jax.jit(lambda v: lax.top_k(jnp.abs(v), k)[1]),
            "select.sample_k_distinct": jax.jit(lambda v, kk=key: select.sample_k_distinct(kk, d, k)),
        }
        if d <= 10**6:  # a full sort of range(d): ~1000x the floor at 1e7, minutes in all
            prims["jax.random.choice(replace=False)"] = jax.jit(
                lambda v, kk=key: jax.random.choice(kk, d, (k,), replace=False)
            )
        for pname, fn in prims.items():
            m = measure(fn, (x,), floor, (x,), rep)
            rows.append(
                {
                    "d": d,
                    "name": pname,
                    "hparams": {"k": k},
                    "compress_s": m["s"],
                    "compress_x": m["ratio"],
                    "primitive": True,
                }
            )
            log(f"[a] d={d:.1e} {pname:34s} {m['ratio']:8.2f}x")
        rows.append(golomb_row(d, k, key, floor, x, rep, log))
        if d == 10**7:  # the exact top-k against lax.top_k across k
            for kk in (10, d // 1000, d // 10):
                for pname, fn in (
                    (f"select.topk_indices, k={kk}", jax.jit(lambda v, kk=kk: select.topk_indices(v, kk))),
                    (f"lax.top_k(|x|), k={kk}", jax.jit(lambda v, kk=kk: lax.top_k(jnp.abs(v), kk)[1])),
                ):
                    m = measure(fn, (x,), floor, (x,), 3)
                    rows.append(
                        {
                            "d": d,
                            "name": pname,
                            "hparams": {"k": kk},
                            "compress_s": m["s"],
                            "compress_x": m["ratio"],
                            "primitive": True,
                        }
                    )
                    log(f"[a] d={d:.1e} {pname:34s} {m['ratio']:8.2f}x")
    return {"floors": floors, "rows": rows, "ratio": ratio}


# --------------------------------------------------------------------------- engine helpers


# (b)'s models: registry name, input shape, hyper-parameters, default global batch
MODELS = {
    "mlp1m": ("mlp", (256,), {"hidden": (1024, 1024)}, 1024),  # 256-1024-1024-10: 1,323,018 parameters
    "mlp": ("mlp", (28, 28, 1), {}, 256),
    "cnn": ("cnn", (32, 32, 3), {}, 256),
}


def _problem(model: str, batch: int | None = None):
    import jax
    import jax.numpy as jnp

    from cconv import models

    name, shape, hp, default_batch = MODELS[model]
    batch = default_batch if batch is None else batch
    spec = models.build(name, shape, 10, jax.random.PRNGKey(0), **hp)
    loss = models.make_loss(spec, "classification")
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, *shape), jnp.float32)
    y = jax.random.randint(jax.random.PRNGKey(2), (batch,), 0, 10)
    return spec, loss, {"x": x, "y": y}


def _steps(trainer, state, batch, n, key0=0, keys=None):
    import jax

    m = None
    for t in range(n):
        state, m = trainer.step(state, batch, jax.random.PRNGKey(key0 + t) if keys is None else keys[t])
    jax.block_until_ready(m)
    return state


def reference_step(loss, optimizer, workers: int, axis: str = "workers"):
    """The hand-written data-parallel step every engine configuration is compared with:
    ``jax.shard_map`` over a 1-D mesh of ``workers`` devices (parameters and optimizer state
    replicated, the batch sharded by rows), ``jax.grad`` of the worker's rows, ``lax.pmean`` of
    the gradient (and of the loss), the optax update; jitted, parameters and optimizer state
    donated.  Returns ``(step(params, opt_state, batch) -> (params, opt_state, loss), place)``,
    ``place(params) -> (params, opt_state)`` replicated on the mesh and ``batch_sharding``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:workers]), (axis,), axis_types=(jax.sharding.AxisType.Auto,))

    def per_device(params, opt_state, batch):
        (value, _), grads = jax.value_and_grad(loss, has_aux=True)(params, {}, batch, None)
        grads = lax.pmean(grads, axis)  # check_vma=False: grads are this device's own
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, lax.pmean(value, axis)

    step = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P(axis)), out_specs=(P(), P(), P()), check_vma=False),
        donate_argnums=(0, 1),
    )
    replicated = NamedSharding(mesh, P())

    def place(params):
        params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=replicated)(params)
        return params, jax.jit(optimizer.init, out_shardings=replicated)(params)

    return step, place, NamedSharding(mesh, P(axis))


STEP_CONFIGS = [
    ("dense", dict(compressor="none")),
    ("topk 1% + EF", dict(compressor=("topk", {"ratio": 0.01}), memory="ef")),
    ("topk 1% + EF, fused", dict(compressor=("topk", {"ratio": 0.01}), memory="ef", granularity="fused")),
    ("gTop-k 1% + EF", dict(compressor=("topk", {"ratio": 0.01}), memory="ef", collective="gtopk")),
    ("DGC 0.1% (memory dgc)", dict(compressor=("dgc", {"ratio": 0.001}), memory="dgc")),
    ("randomk 1% + EF (unscaled)", dict(compressor=("randomk", {"ratio": 0.01, "scaled": False}), memory="ef")),
    ("signsgd + EF", dict(compressor="signsgd", memory="ef")),
    ("signsgd, majority vote", dict(compressor="signsgd", vote=True)),
    ("scaled_sign + EF", dict(compressor="scaled_sign", memory="ef")),
    ("terngrad", dict(compressor="terngrad")),
    ("qsgd s=2", dict(compressor=("qsgd", {"levels": 2}))),
    ("qsgd s=4", dict(compressor=("qsgd", {"levels": 4}))),
    ("powersgd r=4 + EF", dict(compressor=("powersgd", {"rank": 4}), memory="ef")),
]
# issue 16's targets: step time as a multiple of the hand-written reference step
REFERENCE_TARGETS = {"dense": 1.10, "topk 1% + EF": 1.30, "scaled_sign + EF": 2.0, "qsgd s=4": 2.5}


def _engine_cfg(workers, spec):
    from cconv import compressors as C
    from cconv.engine import EngineConfig

    spec = dict(spec)
    comp = spec.pop("compressor")
    name, hp = (comp, {}) if isinstance(comp, str) else comp
    momentum = 0.9 if spec.get("memory") == "dgc" else None
    kw = {"momentum": momentum} if momentum is not None else {}
    # compress_vectors pinned: results/ were measured when 1-D tensors (biases) were compressed too, the
    # default until 2026-11-27 (today's default: dense); a rerun compares with them
    spec.setdefault("compress_vectors", True)
    return EngineConfig(workers=workers, compressor=C.get(name, **hp), **kw, **spec)


def _spread(xs) -> dict:
    """Median, quartiles and range of per-round values."""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "min": min(xs), "max": max(xs)}


def part_b(models_, workers, batch, steps, repeats, configs=None, log=print) -> dict:
    """Step time of each configuration against the hand-written reference step
    (``reference_step``) and against the engine's dense step.

    Every configuration (dense included) and the reference are compiled and warmed up first;
    then ``repeats`` rounds each time a block of ``steps`` reference steps followed by a block of
    each configuration's steps (training goes on from block to block; keys are made outside
    the timed blocks; the batch is placed on the mesh once, ``Trainer.shard``).  Per round, the
    ratio of a configuration's block to that round's reference block; reported: the median
    over rounds and its quartiles and range (the spread), and x dense = median(config) /
    median(dense) over the same rounds."""
    import jax
    import optax

    from cconv.engine import build

    keys = [jax.random.PRNGKey(t) for t in range(steps)]

    def optimizer(cfg):
        return optax.sgd(0.01) if cfg.memory == "dgc" else optax.sgd(0.01, momentum=0.9)

    def prepared(model_spec, loss, b, cfgspec):
        cfg = _engine_cfg(workers, cfgspec)
        tr = build(loss, model_spec.params, optimizer(cfg), cfg, model_state=model_spec.model_state)
        box = [tr.init()]
        placed = tr.shard(b)
        t0 = time.perf_counter()
        box[0] = _steps(tr, box[0], placed, 1)
        first = time.perf_counter() - t0
        box[0] = _steps(tr, box[0], placed, 2)

        def run():
            box[0] = _steps(tr, box[0], placed, steps, keys=keys)

        return run, first

    def reference(model_spec, loss, b):
        step, place, batch_sharding = reference_step(loss, optax.sgd(0.01, momentum=0.9), workers)
        box = list(place(model_spec.params))
        placed = jax.device_put(b, batch_sharding)

        def run(n=steps):
            value = None
            for _ in range(n):
                box[0], box[1], value = step(box[0], box[1], placed)
            jax.block_until_ready(value)

        t0 = time.perf_counter()
        run(1)
        first = time.perf_counter() - t0
        run(2)
        return run, first

    rows = []
    for model in models_:
        spec, loss, b = _problem(model, batch)
        n_params = sum(int(v.size) for v in jax.tree.leaves(spec.params))
        labels = [lb for lb, _ in STEP_CONFIGS if configs is None or lb in configs or lb == "dense"]
        ref_run, ref_first = reference(spec, loss, b)
        runs = {lb: prepared(spec, loss, b, dict(STEP_CONFIGS)[lb]) for lb in labels}
        ref_ts, ts = [], {lb: [] for lb in labels}
        ref_cpu, cpu = [], {lb: [] for lb in labels}  # process CPU time: robust to other load
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            ref_run()
            ref_ts.append((time.perf_counter() - t0) / steps)
            ref_cpu.append((time.process_time() - c0) / steps)
            for lb in labels:
                t0, c0 = time.perf_counter(), time.process_time()
                runs[lb][0]()
                ts[lb].append((time.perf_counter() - t0) / steps)
                cpu[lb].append((time.process_time() - c0) / steps)
        rt, dt = statistics.median(ref_ts), statistics.median(ts["dense"])
        log(f"[b] {model} ({n_params} params, batch {b['y'].shape[0]}) hand-written reference {rt * 1e3:8.2f} ms/step")
        for lb in labels:
            t = statistics.median(ts[lb])
            per_round = _spread([x / r for x, r in zip(ts[lb], ref_ts)])
            per_round_cpu = _spread([x / r for x, r in zip(cpu[lb], ref_cpu)])
            row = {
                "model": model,
                "params": n_params,
                "batch": int(b["y"].shape[0]),
                "config": lb,
                "workers": workers,
                "step_s": t,
                "dense_step_s": dt,
                "reference_step_s": rt,
                "ratio_to_dense": 1.0 if lb == "dense" else t / dt,
                "ratio_to_reference": per_round["median"],
                "ratio_to_reference_spread": per_round,
                "cpu_ratio_to_reference": per_round_cpu["median"],
                "cpu_ratio_to_reference_spread": per_round_cpu,
                "first_step_s": runs[lb][1],
                "reference_first_step_s": ref_first,
            }
            if lb in REFERENCE_TARGETS:
                row["target_x"] = REFERENCE_TARGETS[lb]
                row["meets_target"] = bool(per_round["median"] <= REFERENCE_TARGETS[lb])
            rows.append(row)
            tgt = ""
            if "target_x" in row:
                tgt = f"  target <= {row['target_x']:.2f}: {'met' if row['meets_target'] else 'NOT met'}"
            log(
                f"[b] {model} {lb:28s} {t * 1e3:8.2f} ms/step  {per_round['median']:5.2f}x reference "
                f"(quartiles {per_round['q1']:.2f}-{per_round['q3']:.2f}, range {per_round['min']:.2f}-"
                f"{per_round['max']:.2f})  {row['ratio_to_dense']:5.2f}x dense  "
                f"CPU time {per_round_cpu['median']:5.2f}x reference{tgt}"
            )
    return {"rows": rows, "batch": batch, "workers": workers, "steps_per_block": steps, "repeats": repeats}


def part_c(workers_list, model="cnn", log=print) -> dict:
    import jax
    import optax

    from cconv.engine import build

    spec, loss, _ = _problem(model, 8)
    configs = [
        ("dense allreduce", dict(compressor="none")),
        ("top-k 1% allgather", dict(compressor=("topk", {"ratio": 0.01}), memory="ef")),
        ("gTop-k 1%", dict(compressor=("topk", {"ratio": 0.01}), memory="ef", collective="gtopk")),
        ("parameter server, dense", dict(compressor="none", architecture="parameter-server")),
        (
            "parameter server, top-k 1% up",
            dict(compressor=("topk", {"ratio": 0.01}), memory="ef", architecture="parameter-server"),
        ),
    ]
    rows = []
    available = jax.device_count()
    for label, cfgspec in configs:
        for P in workers_list:
            if P > available:
                rows.append({"config": label, "workers": P, "skipped": f"only {available} devices"})
                continue
            cfg = _engine_cfg(P, cfgspec)
            tr = build(loss, spec.params, optax.sgd(0.01), cfg, model_state=spec.model_state)
            sent, recv = tr.traffic(0)
            rows.append(
                {
                    "config": label,
                    "workers": P,
                    "model": model,
                    "sent_worker": float(sent[-1]),
                    "received_worker": float(recv[-1]),
                    "sent_max": float(max(sent)),
                    "received_max": float(max(recv)),
                }
            )
            log(
                f"[c] {label:32s} P={P:2d} sent/worker {sent[-1] / 1e3:10.1f} kB  "
                f"received/worker {recv[-1] / 1e3:10.1f} kB  (max over ranks {max(sent) / 1e3:.1f} / "
                f"{max(recv) / 1e3:.1f} kB)"
            )
    return {"rows": rows, "model": model, "params": sum(int(v.size) for v in jax.tree.leaves(spec.params))}


def part_d(tensor_counts, workers, log=print) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from cconv import compressors as C
    from cconv.engine import EngineConfig, build

    rows = []
    for n in tensor_counts:
        params = {f"w{i:04d}": jnp.full((64, 32), 0.01 * (i + 1), jnp.float32) for i in range(n)}

        def loss(p, ms, batch, key):
            h = sum(jnp.sum(jnp.tanh(batch["x"] @ w)) for w in p.values())
            return h / len(p), (ms, {})

        batch = {"x": jax.random.normal(jax.random.PRNGKey(0), (workers * 2, 64))}
        for gran in ("layerwise", "fused"):
            cfg = EngineConfig(workers=workers, compressor=C.topk(ratio=0.01), memory="ef", granularity=gran)
            tr = build(loss, params, optax.sgd(0.1), cfg)
            state = tr.init()
            t0 = time.perf_counter()
            lowered = tr.lower(state, batch, jax.random.PRNGKey(0))
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
            rows.append({"tensors": n, "granularity": gran, "trace_lower_s": t1 - t0, "compile_s": t2 - t1})
            log(f"[d] {n:4d} tensors {gran:9s} trace+lower {t1 - t0:6.2f} s  XLA compile {t2 - t1:6.2f} s")
    return {"rows": rows, "workers": workers}


def part_e(seeds, steps, workers, model="mlp", batch=64, log=print) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from cconv.engine import build

    spec, loss, b = _problem(model, batch)
    cfg = _engine_cfg(workers, dict(compressor=("topk", {"ratio": 0.01}), memory="ef"))
    opt = optax.sgd(0.01, momentum=0.9)
    # S separate runs, one after another (each builds and compiles its own step, as S processes would)
    t0 = time.perf_counter()
    first = []
    for s in range(seeds):
        tr = build(loss, spec.params, opt, cfg, model_state=spec.model_state)
        st = tr.init()
        t1 = time.perf_counter()
        st = _steps(tr, st, b, 1, key0=1000 * s)
        first.append(time.perf_counter() - t1)
        _steps(tr, st, b, steps - 1, key0=1000 * s + 1)
    separate = time.perf_counter() - t0
    # one vmapped program
    t0 = time.perf_counter()
    tr = build(loss, spec.params, opt, cfg, model_state=spec.model_state, seeds=seeds)
    st = tr.init()
    bs = jax.tree.map(lambda v: jnp.broadcast_to(v, (seeds, *v.shape)), b)
    keys = lambda t: jax.random.split(jax.random.PRNGKey(t), seeds)
    t1 = time.perf_counter()
    st, m = tr.step(st, bs, keys(0))
    jax.block_until_ready(m)
    vfirst = time.perf_counter() - t1
    for t in range(1, steps):
        st, m = tr.step(st, bs, keys(t))
    jax.block_until_ready(m)
    vmapped = time.perf_counter() - t0
    row = {
        "seeds": seeds,
        "steps": steps,
        "model": model,
        "workers": workers,
        "separate_total_s": separate,
        "vmapped_total_s": vmapped,
        "speedup": separate / vmapped,
        "separate_first_step_s": sum(first),
        "vmapped_first_step_s": vfirst,
        "separate_steady_s": (separate - sum(first)) / (seeds * (steps - 1)) if steps > 1 else None,
        "vmapped_steady_s": (vmapped - vfirst) / (steps - 1) if steps > 1 else None,
    }
    log(
        f"[e] {seeds} seeds x {steps} steps: separate {separate:.2f} s, vmapped {vmapped:.2f} s "
        f"({separate / vmapped:.2f}x faster)"
    )
    return {"rows": [row]}


def part_v(workers, repeats, steps=5, configs=("dense", "topk 1% + EF", "signsgd + EF"), log=print) -> dict:
    """Step time of ``launcher="vmap"`` (every worker on one device) against ``shard_map`` over
    ``workers`` devices, for the quickstart config's model and batch (MLP 64-128-10 on 8x8
    inputs, global batch 256).  Interleaved rounds (a block of ``steps`` shard_map steps, then a
    block of vmap steps, ``repeats`` times); median ratio and its spread (min-max of the per-round
    ratios)."""
    import jax
    import jax.numpy as jnp
    import optax

    from cconv import models
    from cconv.engine import build

    spec = models.build("mlp", (8, 8, 1), 10, jax.random.PRNGKey(0), hidden=(128,))
    loss = models.make_loss(spec, "classification")
    b = {
        "x": jax.random.normal(jax.random.PRNGKey(1), (256, 8, 8, 1), jnp.float32),
        "y": jax.random.randint(jax.random.PRNGKey(2), (256,), 0, 10),
    }

    def prepared(cfgspec, launcher):
        cfg = _engine_cfg(workers, {**cfgspec, "launcher": launcher})
        tr = build(loss, spec.params, optax.sgd(0.1), cfg, model_state=spec.model_state)
        state = _steps(tr, tr.init(), b, 3)  # compile + warm-up
        return lambda: _steps(tr, state, b, steps)

    rows = []
    for label in configs:
        cfgspec = dict(STEP_CONFIGS)[label]
        mesh, one = prepared(cfgspec, "shard_map"), prepared(cfgspec, "vmap")
        ms, vs = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            mesh()
            ms.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            one()
            vs.append(time.perf_counter() - t0)
        ratios = [v / m for v, m in zip(vs, ms)]
        row = {
            "config": label,
            "workers": workers,
            "vmap_step_s": statistics.median(vs) / steps,
            "shard_map_step_s": statistics.median(ms) / steps,
            "ratio_vmap_to_shard_map": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        rows.append(row)
        log(
            f"[v] {label:16s} vmap {row['vmap_step_s'] * 1e3:7.2f} ms/step, shard_map on {workers} devices "
            f"{row['shard_map_step_s'] * 1e3:7.2f} ms/step: {row['ratio_vmap_to_shard_map']:.2f}x "
            f"(rounds {row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
        )
    return {"rows": rows, "batch": 256, "model": "mlp 64-128-10", "steps_per_block": steps, "repeats": repeats}


# --------------------------------------------------------------------------- report


def _fmt(v, digits=2):
    return "" if v is None else f"{v:.{digits}f}"


def markdown(result: dict) -> str:
    m = result["machine"]
    out = [
        f"# cconv benchmarks ({m['backend']})",
        "",
        f"- date (UTC): {m['date_utc']}; git {m.get('git_commit', '?')}; command: `{result['command']}`",
        f"- machine: {m.get('cpu', '?')}, {m['cpu_count']} cores, {m.get('mem_gib', '?')} GiB; "
        f"{m['platform']}; {m['device_count']} {m['backend']} devices",
        f"- jax {m['jax']}, jaxlib {m['jaxlib']}; native top-k kernel: "
        f"{'yes' if m['native_topk_kernel'] else 'NO (lax.top_k fallback)'}",
        f"- malloc environment: {m.get('malloc_env') or 'default'}",
        f"- load average (1, 5, 15 min) at start {result.get('load_start')}, at end {result.get('load_end')}",
        f"- wall time of the suite: {result.get('wall_s', 0):.0f} s",
        "",
    ]
    if "a" in result:
        a = result["a"]
        out += [
            "## (a) Compressors: time as a multiple of the memory floor",
            "",
            "Floor = jitted `sum(abs(x))` (one read of x), measured in the same rounds. "
            "total = compress + decompress. The *write floor* (`2 * x` into a fresh fp32 array) "
            "is the least any dense decompression costs; the last column divides total time by "
            "(read floor + write floor). Sparsifiers at "
            f"ratio {a['ratio']}; medians of interleaved repeats after warm-up.",
            "",
            "| d | read floor (ms) | write floor / read floor |",
            "|---|---|---|",
        ]
        for f in a["floors"]:
            out.append(f"| {f['d']:.1e} | {f['read_floor_s'] * 1e3:.3f} | {f['write_over_read']:.2f} |")
        out += [
            "",
            "| d | compressor | compress | decompress | total | target | meets | vs read+write floor |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in a["rows"]:
            if r.get("primitive"):
                continue
            t = r["target_x"]
            meets = "" if t is None else ("yes" if r["meets_target"] else f"no ({r['total_x'] / t:.1f}x over)")
            out.append(
                f"| {r['d']:.1e} | {r['name']} | {_fmt(r['compress_x'])} | {_fmt(r['decompress_x'])} | "
                f"{_fmt(r['total_x'])} | {'' if t is None else f'<= {t:g}'} | {meets} | "
                f"{_fmt(r['total_vs_read_write_floor_x'])} |"
            )
        out += [
            "",
            "Selection primitives alone (k = ratio * d):",
            "",
            "| d | primitive | time / read floor |",
            "|---|---|---|",
        ]
        for r in a["rows"]:
            if r.get("primitive") and not r.get("coding"):
                out.append(f"| {r['d']:.1e} | `{r['name']}` | {_fmt(r['compress_x'])} |")
        out += [
            "",
            "Golomb-Rice coded positions alone (`cconv.compressors.golomb`; k = ratio * d sorted uniform "
            "positions; bits per position: encoded message, and moved = the worst-case buffer):",
            "",
            "| d | k | encode | decode | total | target | meets | bits/position encoded | moved |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in a["rows"]:
            if r.get("coding"):
                out.append(
                    f"| {r['d']:.1e} | {r['hparams']['k']} | {_fmt(r['compress_x'])} | {_fmt(r['decompress_x'])} | "
                    f"{_fmt(r['total_x'])} | <= {r['target_x']:g} | {'yes' if r['meets_target'] else 'no'} | "
                    f"{r['encoded_bits_per_position']:.2f} | {r['moved_bits_per_position']:.2f} |"
                )
        out.append("")
    if "b" in result:
        b = result["b"]
        out += [
            f"## (b) Training step against hand-written JAX ({b['workers']} devices)",
            "",
            "The reference is a hand-written data-parallel step (`reference_step`: `jax.shard_map`, "
            "`jax.grad`, `lax.pmean` of the gradient, the same optax update, donated state). Every round "
            "times a block of reference steps, then a block of each configuration's; x reference is the "
            "median over rounds of the per-round ratio (quartiles and range: the spread), x dense the "
            f"ratio of medians to the engine's dense step. {b['repeats']} rounds of {b['steps_per_block']} "
            "steps. x reference (CPU) is the same median ratio of the process's CPU time (all XLA "
            "threads): it does not count time the process waited for a core, so it is the figure to "
            "read when other work shares the machine.",
            "",
            "| model | params | batch | configuration | ms / step | x reference | quartiles | range | target "
            "| x dense | x reference (CPU) | first step (s, incl. compile) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in b["rows"]:
            sp = r["ratio_to_reference_spread"]
            tgt = "" if "target_x" not in r else f"<= {r['target_x']:.2f}: {'met' if r['meets_target'] else 'NOT met'}"
            out.append(
                f"| {r['model']} | {r['params']} | {r['batch']} | {r['config']} | {r['step_s'] * 1e3:.2f} | "
                f"{r['ratio_to_reference']:.2f} | {sp['q1']:.2f}-{sp['q3']:.2f} | {sp['min']:.2f}-{sp['max']:.2f} | "
                f"{tgt} | {r['ratio_to_dense']:.2f} | {r.get('cpu_ratio_to_reference', float('nan')):.2f} | "
                f"{r['first_step_s']:.1f} |"
            )
        out.append("")
    if "c" in result:
        c = result["c"]
        out += [
            f"## (c) Bytes per worker per step ({c['model']}, {c['params']} parameters)",
            "",
            "Sent / received by one worker (the last rank; under the parameter server, rank 0 is "
            "also the server: its traffic is the max column).",
            "",
            "| configuration | P | sent / worker (kB) | received / worker (kB) | max sent (kB) | max received (kB) |",
            "|---|---|---|---|---|---|",
        ]
        for r in c["rows"]:
            if "skipped" in r:
                out.append(f"| {r['config']} | {r['workers']} | skipped: {r['skipped']} | | | |")
                continue
            out.append(
                f"| {r['config']} | {r['workers']} | {r['sent_worker'] / 1e3:.1f} | "
                f"{r['received_worker'] / 1e3:.1f} | {r['sent_max'] / 1e3:.1f} | {r['received_max'] / 1e3:.1f} |"
            )
        out.append("")
    if "d" in result:
        out += [
            "## (d) Compile time against the number of parameter tensors (top-k 1% + EF)",
            "",
            "| tensors | granularity | trace + lower (s) | XLA compile (s) |",
            "|---|---|---|---|",
        ]
        for r in result["d"]["rows"]:
            out.append(f"| {r['tensors']} | {r['granularity']} | {r['trace_lower_s']:.2f} | {r['compile_s']:.2f} |")
        out.append("")
    if "e" in result:
        out += [
            "## (e) Vmapped seeds against separate runs (top-k 1% + EF)",
            "",
            "| seeds x steps | model | separate (s) | vmapped (s) | speed-up | first step separate / vmapped (s) "
            "| steady step separate per seed / vmapped all seeds (ms) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in result["e"]["rows"]:
            steady = (
                f"{r['separate_steady_s'] * 1e3:.1f} / {r['vmapped_steady_s'] * 1e3:.1f}"
                if r["separate_steady_s"] is not None
                else ""
            )
            out.append(
                f"| {r['seeds']} x {r['steps']} | {r['model']} | {r['separate_total_s']:.1f} | "
                f"{r['vmapped_total_s']:.1f} | {r['speedup']:.2f} | {r['separate_first_step_s']:.1f} / "
                f"{r['vmapped_first_step_s']:.1f} | {steady} |"
            )
        out.append("")
    if "v" in result:
        v = result["v"]
        out += [
            f"## (v) All workers on one device (launcher vmap) against shard_map on {v['rows'][0]['workers']} "
            f"devices ({v['model']}, global batch {v['batch']})",
            "",
            "| config | vmap (ms/step) | shard_map (ms/step) | vmap / shard_map (median) | per-round min-max |",
            "|---|---|---|---|---|",
        ]
        for r in v["rows"]:
            out.append(
                f"| {r['config']} | {r['vmap_step_s'] * 1e3:.2f} | {r['shard_map_step_s'] * 1e3:.2f} | "
                f"{r['ratio_vmap_to_shard_map']:.2f} | {r['ratio_min']:.2f}-{r['ratio_max']:.2f} |"
            )
        out.append("")
    return "\n".join(out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="a,b,c,d,e", help="comma-separated subset of a,b,c,d,e")
    p.add_argument("--sizes", default="1e5,1e6,1e7,2.5e7", help="(a) vector sizes")
    p.add_argument("--names", default=None, help="(a) compressors (default: all registered)")
    p.add_argument("--ratio", type=float, default=0.01, help="(a) sparsifier ratio")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--models", default="mlp1m,mlp,cnn", help="(b) models: " + ", ".join(MODELS))
    p.add_argument("--workers", type=int, default=8, help="(b), (e) workers")
    p.add_argument(
        "--batch", type=int, default=None, help="(b) global batch (default: per model, mlp1m 1024, others 256)"
    )
    p.add_argument("--steps", type=int, default=3, help="(b) steps per timed block")
    p.add_argument("--b-repeats", type=int, default=11, help="(b) interleaved rounds (medians and spread)")
    p.add_argument(
        "--configs",
        default=None,
        help="(b) subset of step configurations by label, ';'-separated (dense is always run)",
    )
    p.add_argument("--p-list", default="2,4,8,16", help="(c) worker counts")
    p.add_argument("--tensors", default="4,16,64,256", help="(d) numbers of parameter tensors")
    p.add_argument("--seeds", type=int, default=5, help="(e) seeds")
    p.add_argument("--seed-steps", type=int, default=20, help="(e) steps per run")
    p.add_argument("--out", default=str(HERE / "results"), help="output directory")
    p.add_argument("--tag", default=None, help="file name stem (default: the backend, e.g. cpu)")
    p.add_argument(
        "--tuned-malloc",
        action="store_true",
        help="re-run this process with glibc malloc told to keep freed memory "
        "(MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 ...): no page faults on large outputs",
    )
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    bad = sorted(set(args.parts) - set("abcdev"))
    if bad:
        p.error(f"unknown part(s) {bad}; valid: a, b, c, d, e, v")
    return args


def main(argv=None, log=print) -> dict:
    args = parse_args(argv)
    if args.tuned_malloc and any(os.environ.get(k) != v for k, v in TUNED_MALLOC.items()):
        env = {**os.environ, **TUNED_MALLOC}  # malloc reads these at start-up: re-exec
        os.execve(sys.executable, [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], env)
    p_list = [int(v) for v in args.p_list.split(",")]
    _setup_devices(max([args.workers, *p_list]))
    import jax

    sys.path.insert(0, str(ROOT))
    t_start = time.perf_counter()
    result = {
        "command": " ".join(["studies/benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])]),
        "load_start": loadavg(),
        "machine": machine(),
    }
    log(f"machine: {result['machine']}")
    if "a" in args.parts:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
        names = args.names.split(",") if args.names else None
        result["a"] = part_a(sizes, args.repeats, args.ratio, names, log=log)
    if "b" in args.parts:
        configs = None if args.configs is None else [c.strip() for c in args.configs.split(";")]
        unknown = sorted(set(configs or []) - {label for label, _ in STEP_CONFIGS})
        if unknown:
            raise SystemExit(
                f"run.py: error: unknown --configs {unknown}; valid: " + "; ".join(label for label, _ in STEP_CONFIGS)
            )
        bad_models = sorted(set(args.models.split(",")) - set(MODELS))
        if bad_models:
            raise SystemExit(f"run.py: error: unknown --models {bad_models}; valid: " + ", ".join(MODELS))
        result["b"] = part_b(
            args.models.split(","), args.workers, args.batch, args.steps, args.b_repeats, configs, log=log
        )
    if "c" in args.parts:
        result["c"] = part_c(p_list, log=log)
    if "d" in args.parts:
        result["d"] = part_d([int(v) for v in args.tensors.split(",")], min(2, jax.device_count()), log=log)
    if "e" in args.parts:
        result["e"] = part_e(args.seeds, args.seed_steps, args.workers, log=log)
    if "v" in args.parts:  # not in the default --parts
        result["v"] = part_v(args.workers, args.repeats, log=log)
    result["load_end"] = loadavg()
    result["wall_s"] = time.perf_counter() - t_start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.tag or result["machine"]["backend"]
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    log(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
    result["paths"] = [str(out / f"{stem}.json"), str(out / f"{stem}.md")]
    return result


if __name__ == "__main__":
    main()
