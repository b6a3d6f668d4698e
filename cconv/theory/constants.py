"""Compressor constants: variance factor omega or contraction delta, and bits per element.

Two classes of compressors (see ``theory/compressors.md`` for every derivation):

* **unbiased** with variance factor omega:  E[C(x)] = x,  E||C(x) - x||^2 <= omega ||x||^2;
* **delta-contractive**:  E||C(x) - x||^2 <= (1 - delta) ||x||^2,  0 < delta <= 1
  (Stich, Cordonnier & Jaggi 2018; Karimireddy et al. 2019).

Some compressors are neither uniformly: ``kind = "biased"`` with ``delta = 0`` when C is only
non-expansive (E||C(x) - x||^2 <= ||x||^2), or ``delta = None`` when even that fails (an
unscaled sign, stochastic rounding after clipping).

Each compressor's closed forms live in its own module, as the ``Theory`` oracle on its registry
entry (``cconv.compressors.registry.Theory``); this module resolves a compressor, reads the entry
it carries (``Compressor.entry``: memory wrappers such as ``ef(...)`` and a user's renamed copy
keep the wrapped compressor's) and calls the oracle.
A compressor without an oracle, or whose oracle lacks a function, gets a one-line ValueError.
For each compressor it gives

* the worst case over x (``constants(...)``: ``omega`` or ``delta``, ``tight`` when the worst
  case is attained or is the exact supremum), and
* the x-dependent exact value ``error_ratio(c, x) = E||C(x) - x||^2 / ||x||^2`` computed in
  float64 NumPy from the closed forms (independently of the JAX implementation, which the tests
  compare against by Monte Carlo), with ``omega_x = error_ratio`` for unbiased compressors and
  ``delta_x = 1 - error_ratio`` for the others;
* ``bits(c, shape)``: bits per element on the wire, from the papers' closed forms (the tests check
  them against the compressors' ``wire_bytes`` and hence their real payloads).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from cconv import compressors as C
from cconv.compressors.base import Compressor
from cconv.compressors.registry import Bound, Theory, entry_of

KINDS = ("unbiased", "contractive", "biased")


class Constants(NamedTuple):
    """Worst-case constants of a compressor for one shape."""

    name: str
    kind: str  # "unbiased" | "contractive" | "biased"
    omega: float | None  # unbiased: sup_x E||C(x)-x||^2 / ||x||^2
    delta: float | None  # contractive: inf_x 1 - E||C(x)-x||^2/||x||^2 (0: non-expansive only)
    tight: bool  # the worst case is the exact supremum over x (else a valid bound)
    bits: float  # bits per element on the wire
    wire_bytes: int  # bytes of one payload for this shape


def resolve(c: Compressor | str, **hparams) -> Compressor:
    """A Compressor from an object or a registered name plus hyper-parameters.

    Memory wrappers (``ef(<name>)``) have their inner compressor's constants (they carry its entry):
    error feedback changes what is compressed, not the compressor.
    """
    if isinstance(c, Compressor):
        if hparams:
            raise ValueError("give hyper-parameters only with a compressor name, not with a Compressor")
        return c
    if isinstance(c, str):
        return C.get(c, **hparams)
    raise ValueError(f"expected a Compressor or one of: {', '.join(C.names())}; got {c!r}")


def _oracle(c: Compressor, what: str):
    """The function ``what`` of c's ``Theory`` oracle; ValueError when it has no such function."""
    theory: Theory | None = entry_of(c).theory
    fn = getattr(theory, what, None) if theory is not None else None
    if fn is None:
        known = ", ".join(e.name for e in C.entries() if getattr(e.theory, what, None) is not None)
        raise ValueError(f"no constants for compressor {c.name!r} ({what}); known: {known}")
    return fn


def _shape(shape) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape must have non-negative sizes, got {shape}")
    return shape


def _d(shape) -> int:
    return int(np.prod(_shape(shape), dtype=np.int64))


def _itemsize(dtype) -> int:
    import jax.numpy as jnp

    return np.dtype(jnp.dtype(dtype)).itemsize


# --------------------------------------------------------------------------- bits


def wire_bytes(c: Compressor | str, shape, dtype="float32", **hparams) -> int:
    """Payload bytes from the papers' closed forms (module doc of each compressor)."""
    c = resolve(c, **hparams)
    return int(_oracle(c, "wire_bytes")(c, _shape(shape), _itemsize(dtype)))


def encoded_bytes(c: Compressor | str, shape, dtype="float32", **hparams) -> float:
    """Expected bytes of the encoded message (the paper's expected code length); ``wire_bytes``
    for fixed-size formats."""
    c = resolve(c, **hparams)
    fn = getattr(entry_of(c).theory, "encoded_bytes", None)
    if fn is None:
        return float(wire_bytes(c, shape, dtype))
    return float(fn(c, _shape(shape), _itemsize(dtype)))


def bits(c: Compressor | str, shape, dtype="float32", **hparams) -> float:
    """Bits per element on the wire: 8 * wire_bytes / d."""
    d = _d(shape)
    if d == 0:
        raise ValueError("bits: the shape has no elements")
    return 8.0 * wire_bytes(c, shape, dtype, **hparams) / d


# --------------------------------------------------------------------------- worst case


def constants(c: Compressor | str, shape, dtype="float32", **hparams) -> Constants:
    """Worst-case (over x) omega or delta, whether it is tight, and the wire size for ``shape``."""
    c = resolve(c, **hparams)
    shape = _shape(shape)
    d = _d(shape)
    if d == 0:
        raise ValueError("constants: the shape has no elements")
    bound: Bound = _oracle(c, "bound")(c, shape)
    if bound.kind not in KINDS:
        raise ValueError(f"{c.name}: its theory gave kind {bound.kind!r}, not one of {', '.join(KINDS)}")
    nbytes = wire_bytes(c, shape, dtype)
    return Constants(c.name, bound.kind, bound.omega, bound.delta, bound.tight, 8.0 * nbytes / d, nbytes)


def omega(c: Compressor | str, shape, **hparams) -> float:
    """Worst-case variance factor of an unbiased compressor (ValueError for biased ones)."""
    k = constants(c, shape, **hparams)
    if k.kind != "unbiased":
        raise ValueError(f"{k.name} is not unbiased (kind {k.kind}); use delta()")
    return k.omega


def delta(c: Compressor | str, shape, **hparams) -> float:
    """Worst-case contraction factor delta (ValueError when the compressor has no delta)."""
    k = constants(c, shape, **hparams)
    if k.delta is None:
        raise ValueError(f"{k.name} has no contraction factor (kind {k.kind})")
    return k.delta


# --------------------------------------------------------------------------- x-dependent, exact


def error_sq(c: Compressor | str, x, state: Any = None, **hparams) -> float:
    """Exact E||C(x) - x||^2 (expectation over the compressor's randomness), float64 NumPy.

    ``state``: the compressor state the error depends on, e.g. a warm start (default: its
    ``init(x)``).
    """
    c = resolve(c, **hparams)
    fn = _oracle(c, "error_sq")
    x = np.asarray(x).astype(np.float64)
    if x.size == 0:
        return 0.0
    return float(fn(c, x, state))


def error_ratio(c: Compressor | str, x, state: Any = None, **hparams) -> float:
    """E||C(x) - x||^2 / ||x||^2 for this x (0 for x = 0, which compresses to exactly 0)."""
    sq = float(np.sum(np.asarray(x, np.float64) ** 2))
    return 0.0 if sq == 0 else error_sq(c, x, state, **hparams) / sq


def omega_x(c: Compressor | str, x, **hparams) -> float:
    """x-dependent variance factor of an unbiased compressor: E||C(x) - x||^2 / ||x||^2."""
    c = resolve(c, **hparams)
    if not c.unbiased:
        raise ValueError(f"{c.name} is not unbiased; use delta_x()")
    return error_ratio(c, x)


def delta_x(c: Compressor | str, x, state: Any = None, **hparams) -> float:
    """x-dependent contraction 1 - E||C(x) - x||^2 / ||x||^2 (negative when C expands, e.g.
    an unscaled sign of small entries)."""
    return 1.0 - error_ratio(c, x, state, **hparams)


def variance_per_coordinate(c: Compressor | str, x, **hparams) -> np.ndarray:
    """Var[C(x)_i] for the unbiased compressors, float64, flat (one entry per coordinate)."""
    c = resolve(c, **hparams)
    theory = entry_of(c).theory
    fn = theory.variance if theory is not None else None
    out = fn(c, np.asarray(x).astype(np.float64)) if fn is not None and c.unbiased else None
    if out is None:
        unbiased = [e.name for e in C.entries() if e.theory is not None and e.theory.variance]
        raise ValueError(
            f"{c.name} is not an unbiased compressor with a per-coordinate variance "
            f"(those with one: {', '.join(unbiased)})"
        )
    return np.asarray(out, np.float64).reshape(-1)


def worst_case_input(c: Compressor | str, shape, **hparams) -> np.ndarray:
    """An x attaining the worst case (tight compressors), for tests and the notes (each
    compressor's oracle says which: e.g. all magnitudes equal for top-k, e_1 for scaled sign).
    """
    c = resolve(c, **hparams)
    shape = _shape(shape)
    theory = entry_of(c).theory
    fn = theory.worst_case if theory is not None else None
    x = fn(c, shape) if fn is not None else None
    if x is None:
        raise ValueError(f"{c.name}: no attained worst case (bound not tight or not uniform)")
    return np.asarray(x, np.float64).reshape(shape)
