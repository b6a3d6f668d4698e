"""A measured device profile: what ``cconv calibrate`` writes and ``cconv plan --device-profile`` reads.

``measure`` times, on the machine it runs on (the default JAX device), with jitted programs, every
measurement the median of ``repeats`` calls after one warm-up call (compilation excluded):

* ``flops``: sustained FLOP/s of a float32 n x n matrix product (2 n^3 FLOPs), n doubled from 512
  until one product takes ``MIN_CALL_S`` (the best rate seen: on a GPU a small product measures
  the launch, not the device);
* ``mem_bw``: bytes/s of an elementwise pass over a float32 vector (it reads and writes 4 d bytes),
  d grown likewise from 4 M floats;
* ``launch_s``: seconds of the smallest jitted call (one element), dispatch and launch included;
* per compressor (``methods``, each with its entry's ``Bench`` hyper-parameters at ratio 0.01) and
  size d (``sizes``): its compress and decompress times as multiples of the measured read floor
  4 d / mem_bw, the format of ``cconv.theory.schedule.compress.Ratio``.

The file (JSON, ``KIND``) holds the device as ``cconv.theory.devices.Device`` fields and the ratios;
``load`` gives back (``Device``, ratios) and ``cconv.theory.predict`` charges them: compute time
from ``flops``, the fused implementation's compress/decompress from the measured ratios times this
device's read floor (a compressor the profile did not measure falls back to cconv's benchmark rows).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Sequence

from cconv import compressors as C
from cconv.theory.devices import Device
from cconv.theory.schedule.compress import Ratio

KIND = "cconv-device-profile"
VERSION = 1
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)


def default_methods() -> tuple[str, ...]:
    """The compressors measured by default: those whose registry entry sweeps a knob (the ones a
    plan compares at several settings), read from the registry, none named here."""
    return tuple(n for n in C.names() if C.entry(n).knob is not None and C.entry(n).knob.values)


MAX_SIZE = 1 << 27


def _median_s(fn, *args, repeats: int) -> float:
    """Median seconds of ``fn(*args)`` (blocked until ready) over ``repeats`` calls after a warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# A device number is measured on a problem grown (doubled) until one call takes at least this long
# (or the size cap): a 512 x 512 product is launch-bound on a GPU (about 5 us of arithmetic on an
# H100 against about 10 us to launch it), so its FLOP/s would describe the launch, not the device.
MIN_CALL_S = 0.002
MATMUL_SIZES = (512, 1024, 2048, 4096, 8192)
PASS_SIZES = (1 << 22, 1 << 24, 1 << 26)


def _grown_rate(make, work, sizes, repeats: int) -> float:
    """The highest ``work(n) / seconds`` over ``sizes`` in order, stopping after the first size whose
    call takes at least ``MIN_CALL_S`` (a CPU stops at the first; a GPU grows past its launch cost)."""
    best = 0.0
    for n in sizes:
        fn, arg = make(n)
        t = _median_s(fn, arg, repeats=repeats)
        best = max(best, work(n) / t)
        if t >= MIN_CALL_S:
            break
    return best


def _device_numbers(repeats: int) -> tuple[float, float, float]:
    """(FLOP/s of a float32 n x n product: 2 n^3 FLOPs, bytes/s of an elementwise pass over d
    floats: 8 d bytes read and written, seconds of a one-element jitted call)."""
    import jax
    import jax.numpy as jnp

    def matmul(n):
        return jax.jit(lambda x: x @ x), jnp.ones((n, n), jnp.float32)

    def elementwise(d):
        return jax.jit(lambda x: x * 1.5 + 1.0), jnp.ones((d,), jnp.float32)

    flops = _grown_rate(matmul, lambda n: 2.0 * n**3, MATMUL_SIZES, repeats)
    mem_bw = _grown_rate(elementwise, lambda d: 8.0 * d, PASS_SIZES, repeats)
    launch = _median_s(jax.jit(lambda x: x + 1.0), jnp.ones((1,), jnp.float32), repeats=repeats)
    return flops, mem_bw, launch


def _compressor_rows(name: str, sizes: Sequence[int], mem_bw: float, repeats: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    e = C.entry(name)
    c = C.get(name, **(e.bench.hparams(0.01) if e.bench is not None else {}))
    rows = []
    for d in sizes:
        matrix = e.cost is not None and e.cost.flops is not None  # matmuls (low-rank factors): a matrix to factorise
        shape = (1000, d // 1000) if matrix and d >= 2000 else (d,)
        x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
        key = jax.random.PRNGKey(1)
        comp = jax.jit(lambda x, s, k: c.compress(x, s, k)[0])
        state = c.init(x)
        payload = comp(x, state, key)
        dec = jax.jit(lambda p, like: c.decompress(p, like))
        floor = 4.0 * math.prod(shape) / mem_bw
        tc = _median_s(comp, x, state, key, repeats=repeats)
        td = _median_s(dec, payload, x, repeats=repeats)
        rows.append({"d": math.prod(shape), "compress_x": tc / floor, "decompress_x": td / floor})
    return rows


def measure(methods: Sequence[str] | None = None, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 5) -> dict:
    """The profile of the default JAX device (module docstring); ValueError for bad arguments."""
    import jax

    methods = default_methods() if methods is None else methods
    unknown = [m for m in methods if m not in C.names()]
    if unknown:
        raise ValueError(f"unknown compressor(s) {', '.join(unknown)}; valid: {', '.join(C.names())}")
    if not sizes or any(isinstance(d, bool) or not isinstance(d, int) or not 1000 <= d <= MAX_SIZE for d in sizes):
        raise ValueError(f"sizes must be integers in [1000, {MAX_SIZE}], got {list(sizes)!r:.80}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 1000:
        raise ValueError(f"repeats must be an integer in [1, 1000], got {repeats!r}")
    flops, mem_bw, launch = _device_numbers(repeats)
    dev = jax.devices()[0]
    name = f"{dev.platform}:{getattr(dev, 'device_kind', '') or platform.machine()}"
    return {
        "kind": KIND,
        "version": VERSION,
        "device": {"name": name, "flops": flops, "mem_bw": mem_bw, "launch_s": launch},
        "compressors": {m: _compressor_rows(m, sorted(set(sizes)), mem_bw, repeats) for m in methods},
        "measured": {"repeats": repeats, "host": platform.node() or "", "jax": jax.__version__},
    }


def _positive(where: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where} must be a finite number > 0, got {v!r:.40}")
    return float(v)


def parse(data, where: str = "device profile") -> tuple[Device, dict[str, tuple[Ratio, ...]]]:
    """(Device, compressor -> ratios) of a profile's content; a one-line ValueError otherwise."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(f"{where} is not a cconv device profile (written by cconv calibrate --out)")
    if data.get("version") != VERSION:
        raise ValueError(f"{where}: version {data.get('version')!r} is not {VERSION}")
    dev = data.get("device")
    if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
        raise ValueError(f"{where}: 'device' must be an object with a name")
    device = Device(
        dev["name"][:60] or "profiled",
        _positive(f"{where}: device flops", dev.get("flops")),
        _positive(f"{where}: device mem_bw", dev.get("mem_bw")),
        _positive(f"{where}: device launch_s", dev.get("launch_s")),
        f"measured by cconv calibrate ({where})",
    )
    comps = data.get("compressors", {})
    if not isinstance(comps, dict):
        raise ValueError(f"{where}: 'compressors' must be an object")
    bench: dict[str, tuple[Ratio, ...]] = {}
    for name, rows in comps.items():
        if name not in C.names() or not isinstance(rows, list) or not rows:
            raise ValueError(f"{where}: compressors.{str(name)[:40]} is not a registered compressor with rows")
        out = []
        for r in rows:
            if not isinstance(r, dict):
                raise ValueError(f"{where}: compressors.{name} rows must be objects")
            keys = ("d", "compress_x", "decompress_x")
            vals = [_positive(f"{where}: compressors.{name} {k}", r.get(k)) for k in keys]
            out.append(Ratio(*vals))
        bench[name] = tuple(sorted(out))
    return device, bench


def load(path: str) -> tuple[Device, dict[str, tuple[Ratio, ...]]]:
    """``parse`` of the file at ``path`` (cconv's own reader: no link followed)."""
    import json

    from cconv.experiments import io

    try:
        data = json.loads(io.read_text(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"--device-profile {path}: {' '.join(str(e).split())[:200]}") from None
    return parse(data, f"--device-profile {os.path.basename(path)}")


def check_out(path: str) -> None:
    """Refuse, before anything is measured, an ``--out`` that ``write`` may not replace: anything
    but a missing file or a cconv device profile (a link, a directory, another file), or a place
    no directory can be made (``cconv.experiments.io.check_output``); a one-line ValueError."""
    import json

    from cconv.experiments import io

    io.check_output(path, "--out", in_results=False)
    if io.check_entry(path):
        try:
            ok = json.loads(io.read_text(path)).get("kind") == KIND
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"--out {path} exists and is not a cconv device profile; not overwriting it")


def write(path: str, profile: dict) -> None:
    """Write ``profile`` to ``path`` atomically (its directory made if missing); an existing file
    is replaced only if it is a cconv device profile (``check_out``: nothing else is overwritten)."""
    from cconv.experiments import io

    check_out(path)
    io.check_writable(os.path.dirname(os.path.abspath(path)))
    io.write_json(path, profile)


__all__ = ["KIND", "VERSION", "measure", "parse", "load", "check_out", "write", "DEFAULT_SIZES", "default_methods"]
