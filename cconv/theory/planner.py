"""Predicted iteration time, speedup and traffic of every registered compressor on a network.

Model (``theory/planner.md``): P workers each process a local mini-batch of M samples of a
model with D parameters and C FLOPs per sample (forward + backward) on a device sustaining F
FLOP/s, then exchange their (compressed) gradients:

    t_comp = M C / F
    t_iter(P) = t_comp + t_comm(P)              (BSP: communication after backpropagation)
    t_iter(P) = t_comp + exposed(P)             (``overlap``: wait-free backprop, Zhang et al.
                                                 2017, behind a backward pass of 2/3 t_comp)
    speedup(P) = P t_comp / t_iter(P)           (throughput over one worker, weak scaling, as
                                                 in the survey's evaluation)

t_comm is ``cconv.theory.network.step_comm_time`` of the collectives the method issues, with
payload sizes from the compressors' own ``wire_bytes`` (``nbytes="encoded"``: the expected encoded
message, ``cconv.theory.constants.encoded_bytes``, for entropy-coded formats).  Compression compute (selection,
packing) is not modelled, and lossy methods may need more iterations to reach the same
accuracy: the speedup is per iteration, not time-to-accuracy.

Columns: payload/worker is what one worker contributes per iteration (the compressors'
``wire_bytes``); sent/worker is what it puts on its link under the flat algorithms of
``cconv.theory.network.bytes_sent`` (also for two-level networks).

Granularity ``fused`` (default): the compressed tensors are one flat vector (tensor fusion, as
Horovod and the gTop-k paper do), one call per step.  ``layerwise``: one call per tensor (needs
the workload's tensor shapes), as each tensor's gradient becomes ready.  Vectors follow the
engine's rule (``compress_vectors``, default ``ENGINE_DEFAULTS``): the 1-D tensors (biases, norm
scales) travel dense in an all-reduce of their own unless compressed; a workload known only by D
is one flat vector, compressed whole.

Methods come from the compressor registry (``all_methods()``), nothing here names a compressor:

* every registered compressor is a method of its own name, exchanged by its aggregation: a
  summable payload (``"allreduce"``) in one ring all-reduce, any other single payload
  (``"allgather"``) in one ring all-gather.  An aggregation that is not a network collective
  (PowerSGD's low-rank exchange) is a sequence of all-reduces, one per floating leaf of the
  payload the compressor emits for each tensor (P, then Q), found with ``jax.eval_shape`` of its
  ``compress``; it factorises tensors, so it needs the workload's tensor shapes and is omitted
  (with a note) for a workload known only by D;
* the identity baseline (``cconv.compressors.IDENTITY``) is lossless and has a second method,
  ``<identity>-ps``: push and pull through parameter servers;
* each extra collective an entry declares (``Entry.collectives``) with a cost model here
  (``EXTRA_COLLECTIVES``: ``"gtopk"`` -> recursive doubling) is a method too.  Naming rule: the
  method is called ``<collective>`` for one declarer, the one whose name the collective's name
  ends with (gTop-k is the global top-k), else the first declarer in name order; every other
  declarer's method is ``<compressor>-<collective>``.  A registered compressor of the same name
  as the collective keeps the name; the collective's method is then ``<declarer>-<collective>``;
* the order is the identity baseline first, then compressors in name order, each followed by
  its extra collectives' methods.  ``Plan.best`` breaks ties in speedup and bytes by the larger
  contraction delta, so the winner does not depend on the order;
* the sweep: ``Entry.knob`` names the hyper-parameter and its default values; ``sweep`` (the
  CLI's ``--sweep NAME=v1,v2`` and its aliases ``--ratios``, ``--ranks``, ``--levels``)
  overrides the values of a knob by name.  A knob without values plans the defaults; a method
  whose defaults do not build (a required hyper-parameter without a default) is left out of
  the default set with a note and is planned once its knob values are given.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cconv import compressors as C
from cconv.compressors.base import Compressor, payload_bytes
from cconv.theory import constants as K
from cconv.theory import implementation as IM
from cconv.theory import network as N
from cconv.theory import workloads as W

BACKWARD_SHARE = 2.0 / 3.0  # backward ~ 2x forward
FUSION_BYTES = 64 * 2**20  # Horovod's default fusion buffer
PS = "ps"  # the parameter-server variant of the identity baseline
SINGLE_COLLECTIVES = ("allreduce", "allgather")  # aggregations that are one network collective
EXTRA_COLLECTIVES = {"gtopk": "recursive_doubling"}  # Entry.collectives -> network cost kind
ALIASES = {"ratios": "ratio", "ranks": "rank", "levels": "levels"}  # plan(...) keyword -> knob
MEAN = "mean"  # Row.phase of an optimizer's mean over the run's steps
MAX_STEPS = 10**6  # an optimizer method's run length (each step's phase is decided on the host: ~5 s at the cap)


class Method(NamedTuple):
    """One planned method: a registered compressor and how its payload travels.

    ``collective`` None: the compressor's aggregation; ``PS``: parameter-server push + pull; else
    a ``cconv.theory.network`` collective kind (an extra collective of the entry).
    """

    name: str
    compressor: str
    collective: str | None
    lossless: bool
    knob: C.Knob | None


class Row(NamedTuple):
    method: str
    setting: str
    payload_bytes: float  # payload bytes one worker contributes per iteration
    sent_bytes: float  # bytes one worker sends per iteration under the algorithms
    comm_s: float  # communication seconds (exposed seconds with overlap)
    iter_s: float
    speedup: float
    lossless: bool
    constant: str = ""  # the compressor's class on a D-vector: omega=..., delta=..., biased
    knobs: tuple = ()  # (name, value) pairs of the setting's hyper-parameters
    phase: str = ""  # "": the method's every step; MEAN: an optimizer's mean over the run; else one of its phases
    steps: int = 0  # an optimizer's rows: the run's steps the row covers (its phase's, or all for MEAN)
    kinds: tuple = ()  # a phase row: the synchronization mode's kinds of its steps


class Plan(NamedTuple):
    workload: W.Workload
    network: N.Network | N.Hierarchical
    workers: int
    device_flops: float
    compute_s: float
    rows: list[Row]
    notes: list[str]

    def best(self, lossless_only: bool = False, contractive_only: bool = False) -> Row:
        """The fastest row; ``lossless_only``: dense methods; ``contractive_only``: methods with a
        contraction delta > 0 (error feedback's guarantee, theory/convergence.md) or lossless.
        Ties (equal speedup and bytes sent) go to the larger delta, then to the earlier row."""
        rows = [r for r in self.rows if (r.lossless or not lossless_only) and r.phase in ("", MEAN)]
        if contractive_only:
            rows = [r for r in rows if r.lossless or r.constant.startswith("delta=")]
        if not rows:
            raise ValueError(f"no {'lossless' if lossless_only else 'contractive'} method in this plan")
        return max(rows, key=lambda r: (r.speedup, -r.sent_bytes, _delta_of(r)))


def _delta_of(r: Row) -> float:
    return float(r.constant[len("delta=") :]) if r.constant.startswith("delta=") else -1.0


# --------------------------------------------------------------------------- methods


def identity_name() -> str:
    """The registered name of the identity compressor (the dense baseline)."""
    return C.IDENTITY


def _collective_methods() -> dict[tuple[str, str], str]:
    """(compressor, collective) -> method name, by the naming rule of the module docstring."""
    taken = set(C.names())
    declarers: dict[str, list[str]] = {}
    for e in C.entries():
        for col in e.collectives:
            if col in EXTRA_COLLECTIVES:
                declarers.setdefault(col, []).append(e.name)
    out = {}
    for col, names in declarers.items():
        suffix = [n for n in names if col != n and col.endswith(n)]
        owner = max(suffix, key=len) if suffix else names[0]
        for n in names:
            out[(n, col)] = col if n == owner and col not in taken else f"{n}-{col}"
    return out


def all_methods() -> dict[str, Method]:
    """Every method the planner knows, in table order (see the module docstring)."""
    ident = identity_name()
    base = C.entry(ident)
    out = {
        ident: Method(ident, ident, None, True, base.knob),
        f"{ident}-{PS}": Method(f"{ident}-{PS}", ident, PS, True, base.knob),
    }
    extra = _collective_methods()
    for e in C.entries():
        if e.name == ident:
            continue
        out[e.name] = Method(e.name, e.name, None, False, e.knob)
        for col in e.collectives:
            if (e.name, col) in extra:
                name = extra[(e.name, col)]
                out[name] = Method(name, e.name, EXTRA_COLLECTIVES[col], False, e.knob)
    return out


def knob_names() -> list[str]:
    """Names of the registered knobs (what ``sweep`` may override)."""
    return sorted({e.knob.name for e in C.entries() if e.knob is not None})


def settings(
    method: Method, sweep: Mapping[str, Sequence] | None = None, fixed: Mapping[str, Any] | None = None
) -> list[dict]:
    """The hyper-parameter sets a method is planned with: its knob's values (``sweep`` overrides
    them by knob name); ``[{}]`` (the defaults) without a knob or without values.  ``fixed``
    (name -> value, e.g. ``positions="golomb"``) is added to every set of a method whose
    compressor has a hyper-parameter of that name; a ``fixed`` knob (``ratio=0.5``) is the knob's
    one value (``sweep`` may not name it too)."""
    knob, sweep = method.knob, sweep or {}
    names = {p.name for p in C.entry(method.compressor).schema.params}
    base = {k: v for k, v in (fixed or {}).items() if k in names}
    if knob is not None and knob.name in base and knob.name in sweep:
        raise ValueError(f"{knob.name} is both fixed and swept: give its values once (--sweep or --hparam)")
    if knob is None or knob.name in base or (knob.name not in sweep and not knob.values):
        return [dict(base)]
    return [{**base, knob.name: v} for v in (sweep[knob.name] if knob.name in sweep else knob.values)]


def kind_of(method: Method, c: Compressor) -> str:
    """The exchange of one call: a network collective kind, ``PS``, or an aggregation that is not a
    network collective (planned as one all-reduce per payload leaf).  A registered aggregation
    that is no network collective but follows the DECODE or SUM algebra moves the payloads by a
    gather or a sum (``intsum``: the codes gathered, the workers agreeing on the scale by a
    control reduction; its ring sum of integer levels is chosen only when cheaper): planned as
    that collective of the payload, not per floating leaf."""
    if method.collective:
        return method.collective
    kind = c.aggregation
    if kind in SINGLE_COLLECTIVES or kind not in C.AGGREGATIONS:
        return kind
    return {C.DECODE: "allgather", C.SUM: "allreduce"}.get(C.AGGREGATIONS[kind].algebra, kind)


def per_tensor(kind: str) -> bool:
    """An aggregation that is not one network collective works per tensor (PowerSGD's low-rank
    factors of each matrix): it needs the workload's tensor shapes."""
    return kind != PS and kind not in SINGLE_COLLECTIVES and kind not in N.COLLECTIVES


# --------------------------------------------------------------------------- byte model


def payload_leaf_bytes(c: Compressor, shape: tuple[int, ...], dtype: str = "float32") -> list[float]:
    """Bytes of each floating leaf of the payload ``c`` emits for a tensor of ``shape`` (from
    ``jax.eval_shape`` of ``init`` + ``compress``: nothing is computed).  Integer leaves (a shared
    PRNG key) are identical on every worker and are not communicated."""
    like = jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))
    payload = jax.eval_shape(lambda x, k: c.compress(x, c.init(x), k)[0], like, jax.random.PRNGKey(0))
    return [float(payload_bytes(leaf)) for leaf in jax.tree.leaves(payload) if jnp.issubdtype(leaf.dtype, jnp.floating)]


BYTES = ("moved", "encoded")  # what a payload counts: its buffer, or its expected encoded message


def flat(workload: W.Workload) -> bool:
    """A workload known only by D: one flat vector standing for all its tensors (not a bias)."""
    return len(workload.shapes) == 1 and len(workload.shapes[0]) == 1


def compressed_tensors(workload: W.Workload, compress_vectors: bool) -> list[bool]:
    """Which of the workload's tensors are compressed under the engine's rule
    (``cconv.engine.exchange.make_plan``): all but the 1-D ones (biases, norm scales) unless
    ``compress_vectors``; a flat workload (``flat``) is compressed whole."""
    return [compress_vectors or flat(workload) or len(s) > 1 for s in workload.shapes]


def calls(
    method: Method,
    c: Compressor,
    workload: W.Workload,
    granularity: str,
    nbytes: str = "moved",
    compress_vectors: bool | None = None,
) -> list[tuple[str, float, int]]:
    """(kind, bytes, tensor index) of every call, in forward order of the tensors.  ``nbytes``:
    ``moved`` = the payload buffers (``wire_bytes``); ``encoded`` = the expected encoded message
    (``cconv.theory.constants.encoded_bytes``, the papers' expected code lengths; equal for
    fixed-size formats), what a transport sending only the used bits would move.
    ``compress_vectors`` (None: ``cconv.theory.implementation.vectors_of``, the engine's default):
    unless true, the 1-D tensors travel dense in an all-reduce (``fused``: one call of their 4 n
    bytes, after the compressed vector of the other tensors' elements; ``layerwise``: one each)."""
    kind = kind_of(method, c)
    if not per_tensor(kind) and kind != PS and C.registered_name(c) != identity_name():
        return _split_calls(kind, c, workload, granularity, nbytes, compress_vectors)
    out: list[tuple[str, float, int]] = []
    if per_tensor(kind):
        cache: dict[tuple[int, ...], list[float]] = {}
        phases: list[float] = []
        for i, s in enumerate(workload.shapes):
            leaves = cache[s] if s in cache else cache.setdefault(s, payload_leaf_bytes(c, s))
            if granularity == "layerwise":
                out += [("allreduce", b, i) for b in leaves]
            else:
                phases += [0.0] * (len(leaves) - len(phases))
                for j, b in enumerate(leaves):
                    phases[j] += b
        return out if granularity == "layerwise" else [("allreduce", b, 0) for b in phases]
    shapes = workload.shapes if granularity == "layerwise" else ((workload.params,),)
    for i, s in enumerate(shapes):
        b = float(K.encoded_bytes(c, s) if nbytes == "encoded" else c.wire_bytes(s, "float32"))
        if kind == PS:
            out += [("ps_push", b, i), ("ps_pull", b, i)]
        else:
            out.append((kind, b, i))
    return out


def _split_calls(kind, c, workload, granularity, nbytes, compress_vectors) -> list[tuple[str, float, int]]:
    """``calls`` of a compressor exchanged by one collective, its vectors dense unless compressed."""
    mask = compressed_tensors(workload, IM.vectors_of(IM.get(IM.DEFAULT), compress_vectors))
    size = (lambda u: K.encoded_bytes(c, u)) if nbytes == "encoded" else (lambda u: c.wire_bytes(u, "float32"))
    shapes = workload.shapes
    if granularity == "layerwise":
        return [(kind, float(size(s)), i) if m else ("allreduce", 4.0 * math.prod(s), i) for i, (s, m) in
                enumerate(zip(shapes, mask))]  # fmt: skip
    d = sum(math.prod(s) for s, m in zip(shapes, mask) if m)
    dense = sum(math.prod(s) for s, m in zip(shapes, mask) if not m)
    return ([(kind, float(size((d,))), 0)] if d else []) + ([("allreduce", 4.0 * dense, 0)] if dense else [])


# --------------------------------------------------------------------------- constants


def _combine(ks: list[K.Constants]) -> tuple[str, float | None]:
    """The weakest class over tensors: biased if any is; else the largest omega or smallest delta
    (lossless tensors, omega = 0, are neutral); a mix of omega > 0 and delta is biased."""
    if any(k.kind == "biased" for k in ks):
        return "biased", None if any(k.delta is None for k in ks) else 0.0
    lossy = [k for k in ks if not (k.kind == "unbiased" and k.omega == 0.0)] or ks[:1]
    kinds = {k.kind for k in lossy}
    if kinds == {"unbiased"}:
        return "unbiased", max(k.omega for k in lossy)
    if kinds == {"contractive"}:
        return "contractive", min(k.delta for k in lossy)
    return "biased", None


def constant(c: Compressor, workload: W.Workload, tensors: bool = False) -> str:
    """The compressor's worst-case constant (cconv.theory.constants) on the flat D-vector, or with
    ``tensors`` the weakest over the workload's tensor shapes; "unknown" without a theory."""
    shapes = list(dict.fromkeys(workload.shapes)) if tensors else [(workload.params,)]
    try:
        ks = [K.constants(c, s) for s in shapes]
    except ValueError:
        return "unknown"
    kind, value = _combine(ks)
    if kind == "unbiased":
        return f"omega={value:.3g}"
    if kind == "contractive":
        return f"delta={value:.3g}"
    return "delta>=0" if value == 0.0 else "biased"


# --------------------------------------------------------------------------- optimizers


def optimizer_methods() -> dict[str, Callable]:
    """The run-config optimizers whose workers send something else than their gradient (1-bit Adam,
    0/1 Adam: ``cconv.engine.optimizers.OPTIMIZERS``), name -> factory, each planned phase by phase
    (``optimizer_rows``); a name a compressor method has stays the compressor's.  Read lazily: the
    engine sits above the theory, and only these methods need it."""
    from cconv.engine.optimizers import OPTIMIZERS  # importing cconv.engine registers them

    taken = all_methods()
    return {n: f for n, f in OPTIMIZERS.items() if n not in taken}


def optimizer_params(factory: Callable) -> dict[str, Any]:
    """A factory's hyper-parameters that ``fixed`` may set: name -> default, for those whose default
    is a number or a flag (``learning_rate`` and object-valued ones, a compressor, a mask, are not)."""
    out = {}
    for i, p in enumerate(inspect.signature(factory).parameters.values()):
        if i and isinstance(p.default, (bool, int, float)):
            out[p.name] = p.default
    return out


def optimizer_stages(factory: Callable, knobs: Mapping[str, Any], steps: int, workload: W.Workload, workers: int):
    """(the optimizer object, its run's ``cconv.engine.stages.Stage`` list): what each of the first
    ``steps`` steps sends, from the engine fields and schedule the object carries (the learning rate
    does not change what travels).  Cached: a plan on several networks walks the run once."""
    bad = [k for k, v in knobs.items() if not isinstance(v, (bool, int, float, np.number))]
    if bad:
        raise ValueError(f"{', '.join(bad)}: an optimizer's hyper-parameter set by the plan is a number or a flag")
    return _stages(factory, tuple(knobs.items()), steps, tuple(workload.shapes), workers)


@functools.lru_cache(maxsize=16)
def _stages(factory: Callable, knobs: tuple, steps: int, shapes: tuple, workers: int):
    from cconv.engine.stages import of_optimizer

    tx = factory(0.0, **dict(knobs))
    # a workload known only by D is one flat vector standing for all its tensors, not a bias: it is
    # compressed as a whole (the engine leaves real 1-D tensors dense, ``compress_vectors``)
    flat = {"compress_vectors": True} if len(shapes) == 1 and len(shapes[0]) == 1 else {}
    return tx, tuple(of_optimizer(tx, steps, shapes, workers=workers, **flat))


def stage_calls(stage, workload: W.Workload, granularity: str, nbytes: str = "moved") -> list[tuple[str, float, int]]:
    """(kind, bytes, tensor index) of the calls of one step of ``stage``: none for a step that
    sends nothing; the dense all-reduce; or the compressor's payloads as the engine packs them
    (``Stage.compressed``/``fused``: one payload per compressed tensor, or one of their
    concatenation, each with its own scale, ``wire_bytes``), exchanged by its aggregation, and the
    tensors it leaves dense in an all-reduce.  ``granularity`` fused: one call per kind (their
    bytes summed, tensor fusion); layerwise: one per payload."""
    from cconv.engine.stages import DENSE, NOTHING  # the stage's own words (engine: imported when planned)

    if stage.sends == NOTHING:
        return []
    ident = identity_name()
    if stage.sends == DENSE:
        return calls(Method(ident, ident, None, True, None), C.get(ident), workload, granularity, nbytes)
    c = stage.compressor
    kind = kind_of(Method(c.name, c.name, None, False, None), c)
    if per_tensor(kind):
        raise ValueError(f"{c.name}'s aggregation {kind!r} is not a network collective: not planned for an optimizer")
    shapes, mask = workload.shapes, stage.compressed
    units = [(i, s) for i, (s, m) in enumerate(zip(shapes, mask)) if m]
    if stage.fused:
        units = [(0, (sum(math.prod(s) for _, s in units),))]
    size = (lambda u: K.encoded_bytes(c, u)) if nbytes == "encoded" else (lambda u: c.wire_bytes(u, "float32"))
    out = [(kind, float(size(u)), i) for i, u in units]
    out += [("allreduce", 4.0 * math.prod(s), i) for i, (s, m) in enumerate(zip(shapes, mask)) if not m]
    if granularity == "layerwise":
        return out
    kinds = list(dict.fromkeys(k for k, _, _ in out))
    return [(k, sum(b for kk, b, _ in out if kk == k), 0) for k in kinds]


def _priced(su: _Setup, cs: list[tuple[str, float, int]]) -> tuple[float, float, float]:
    """(payload, sent bytes, communication seconds) of one step's calls."""
    payload = sum(b for k, b, _ in cs if k != "ps_pull")
    sent = sum(N.bytes_sent(k, b, su.workers, servers=su.servers) for k, b, _ in cs)
    return payload, sent, (_comm_time(su, cs) if cs else 0.0)


def optimizer_rows(su: _Setup, name: str, factory: Callable, knobs: dict, steps: int) -> list[Row]:
    """An optimizer's rows: one per stage of its run of ``steps`` steps (the seconds and bytes of
    one of its steps) and their mean over the run (``MEAN``: total seconds / steps, bytes likewise;
    its speedup P t_comp / mean step, the run's throughput).  Constant: its compressor's."""
    from cconv.engine.stages import DENSE

    tx, stages = optimizer_stages(factory, knobs, steps, su.workload, su.workers)
    setting = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "-"
    out, const = [], "omega=0"
    for st in stages:
        payload, sent, comm = _priced(su, stage_calls(st, su.workload, su.granularity, su.nbytes))
        it = su.compute + comm
        label = st.compressor.name if st.compressor is not None else st.sends
        own = "omega=0" if st.sends == DENSE else ""  # the identity's; a step that sends nothing has none
        if st.compressor is not None:
            const = own = constant(st.compressor, su.workload)
        row = Row(name, setting, payload, sent, comm, it, su.workers * su.compute / it, st.compressor is None, own)
        out.append(row._replace(knobs=tuple(knobs.items()), phase=label, steps=st.steps, kinds=st.kinds))
    mean = {f: sum(getattr(r, f) * r.steps for r in out) / steps for f in ("payload_bytes", "sent_bytes", "comm_s")}
    it = su.compute + mean["comm_s"]
    lossless = all(r.lossless for r in out)
    speedup = su.workers * su.compute / it
    head = Row(name, setting, mean["payload_bytes"], mean["sent_bytes"], mean["comm_s"], it, speedup, lossless, const)
    return [head._replace(knobs=tuple(knobs.items()), phase=MEAN, steps=steps), *out]


# --------------------------------------------------------------------------- the plan


def _sweep(sweep: Mapping[str, Sequence] | None, aliases: Mapping[str, Sequence | None]) -> dict:
    out = {str(k): list(v) for k, v in (sweep or {}).items()}
    for kw, knob in ALIASES.items():
        if aliases.get(kw) is not None:
            if knob in out:
                raise ValueError(f"the {knob} values are given twice ({kw} and sweep {knob}=)")
            out[knob] = list(aliases[kw])
    unknown = sorted(set(out) - set(knob_names()))
    if unknown:
        raise ValueError(f"unknown sweep knob(s) {', '.join(unknown)}; knobs: {', '.join(knob_names())}")
    return out


def _check(workers: int, device_flops: float, granularity: str, nbytes: str) -> None:
    """One-line ValueErrors for bad arguments of ``plan``."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not (isinstance(device_flops, (int, float)) and math.isfinite(device_flops) and device_flops > 0):
        raise ValueError(f"device_flops must be a number > 0, got {device_flops!r}")
    if granularity not in ("fused", "layerwise"):
        raise ValueError(f"granularity must be one of fused, layerwise; got {granularity!r}")
    if nbytes not in BYTES:
        raise ValueError(f"nbytes must be one of {', '.join(BYTES)}; got {nbytes!r}")


def _build(
    method: Method, sweep: dict, fixed: Mapping[str, Any] | None, explicit: bool, layered: bool, notes: list[str]
) -> list[tuple[dict, Compressor]] | None:
    """The compressors of a method's settings, or None (with a note) when it cannot be planned: its
    settings do not build (an error when the method was asked for by name) or it needs tensor shapes
    the workload does not have."""
    try:
        built = [(hp, C.get(method.compressor, **hp)) for hp in settings(method, sweep, fixed)]
    except ValueError as e:
        if explicit:
            raise
        knob = method.knob
        if knob is None or knob.values or knob.name in sweep:
            notes.append(f"{method.name} omitted: {e}")
        else:
            notes.append(f"{method.name} omitted: its knob {knob.name} has no default (give --sweep {knob.name}=...)")
        return None
    if not layered and any(per_tensor(kind_of(method, c)) for _, c in built):
        notes.append(f"{method.name} needs the tensor shapes (use --workload); omitted")
        return None
    return built


def _check_steps(steps: int | None, planned: list[str], optimizers: list[str]) -> None:
    """An optimizer method needs the run's length, which only such a method reads (one-line ValueErrors)."""
    if steps is None:
        if planned:
            raise ValueError(
                f"{', '.join(planned)} {'is' if len(planned) == 1 else 'are'} planned over a run: give its length "
                "(steps; cconv plan --steps N), which sets the share of each phase"
            )
        return
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer in [1, {MAX_STEPS}], got {steps!r}")
    if not planned:
        raise ValueError(
            f"steps is the run length of an optimizer method ({', '.join(optimizers)}): none is among the methods"
        )


class _Setup(NamedTuple):
    """What every row of one plan shares."""

    workload: W.Workload
    workers: int
    net: N.Network | N.Hierarchical
    servers: int
    granularity: str
    overlap: bool
    nbytes: str
    compute: float  # seconds of forward + backward
    backward: float  # seconds of the backward pass
    ready_of: np.ndarray  # when each tensor's gradient is ready, from the start of the backward pass
    compress_vectors: bool | None = None  # 1-D tensors compressed (None: the engine's default)


def _setup(workload, workers, net, device_flops, servers, granularity, overlap, nbytes) -> _Setup:
    """The shared quantities; ``servers`` None: one server per worker machine, as the survey's BytePS
    runs.  Backprop runs from the last tensor to the first, each tensor taking a share of the backward
    pass proportional to its size."""
    if servers is None:
        servers = max(1, workers // net.per_node) if isinstance(net, N.Hierarchical) else workers
    compute = workload.batch * workload.flops_per_sample / device_flops
    backward = BACKWARD_SHARE * compute
    sizes = np.array([float(np.prod(s)) for s in workload.shapes])
    ready_of = backward * np.cumsum(sizes[::-1])[::-1] / sizes.sum()
    return _Setup(workload, workers, net, servers, granularity, overlap, nbytes, compute, backward, ready_of)


def _comm_time(su: _Setup, cs: list[tuple[str, float, int]]) -> float:
    """Seconds of the calls (exposed seconds behind the backward pass with ``overlap``)."""
    colls = [(k, b) for k, b, _ in cs]
    if not su.overlap:
        return N.step_comm_time(colls, su.workers, su.net, servers=su.servers)
    layerwise = su.granularity == "layerwise"
    ready = [float(su.ready_of[i]) for _, _, i in cs] if layerwise else [su.backward] * len(cs)
    ov = N.Overlap(su.backward, FUSION_BYTES if layerwise else 0, ready)
    return N.step_comm_time(colls, su.workers, su.net, ov, servers=su.servers)


def _row(su: _Setup, method: Method, hp: dict, c: Compressor) -> Row:
    """One method at one setting."""
    cs = calls(method, c, su.workload, su.granularity, su.nbytes, su.compress_vectors)
    payload = sum(b for k, b, _ in cs if k != "ps_pull")
    sent = sum(N.bytes_sent(k, b, su.workers, servers=su.servers) for k, b, _ in cs)
    comm = _comm_time(su, cs)
    it = su.compute + comm
    setting = ", ".join(f"{k}={v}" for k, v in hp.items()) or "-"
    const = constant(c, su.workload, per_tensor(kind_of(method, c)))
    speedup = su.workers * su.compute / it
    return Row(method.name, setting, payload, sent, comm, it, speedup, method.lossless, const, tuple(hp.items()))


def plan(
    workload: W.Workload,
    workers: int,
    net: N.Network | N.Hierarchical,
    device_flops: float = W.SURVEY_DEVICE_FLOPS,
    *,
    sweep: Mapping[str, Sequence] | None = None,
    ratios: Sequence[float] | None = None,
    ranks: Sequence[int] | None = None,
    levels: Sequence[int] | None = None,
    granularity: str = "fused",
    overlap: bool = False,
    methods: Sequence[str] | None = None,
    servers: int | None = None,
    nbytes: str = "moved",
    fixed: Mapping[str, Any] | None = None,
    steps: int | None = None,
    compress_vectors: bool | None = None,
) -> Plan:
    """Predict every method's iteration time on ``net`` (see the module docstring for the model).

    ``sweep``: knob name -> values (overrides ``Entry.knob``'s); ``ratios``, ``ranks``,
    ``levels`` are aliases of ``sweep["ratio"]``, ``sweep["rank"]``, ``sweep["levels"]``.
    ``nbytes``: ``moved`` (payload buffers) or ``encoded`` (expected encoded messages), see ``calls``.
    ``fixed``: hyper-parameters set for every method that has them (``settings``; an optimizer's
    ``optimizer_params``).  ``steps``: the run's length, over which an optimizer method
    (``optimizer_methods``) is planned phase by phase; without ``methods``, it adds them all.
    ``compress_vectors``: whether 1-D tensors are compressed (``calls``; None: the engine's default, dense).
    """
    _check(workers, device_flops, granularity, nbytes)
    table = all_methods()
    sweep = _sweep(sweep, {"ratios": ratios, "ranks": ranks, "levels": levels})
    chosen = list(table) if methods is None else list(methods)
    opts = optimizer_methods() if steps is not None or any(m not in table for m in chosen) else {}
    chosen += list(opts) if methods is None else []
    unknown = [m for m in chosen if m not in table and m not in opts]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join([*table, *opts])}")
    _check_steps(steps, [m for m in chosen if m in opts], list(opts))
    su = _setup(workload, workers, net, device_flops, servers, granularity, overlap, nbytes)
    su = su._replace(compress_vectors=compress_vectors)
    notes = []
    layered = len(workload.shapes) > 1
    if granularity == "layerwise" and not layered:
        notes.append("layerwise granularity without tensor shapes: the model is one tensor")
    rows = []
    for m in chosen:
        if m in opts:
            knobs = {k: v for k, v in (fixed or {}).items() if k in optimizer_params(opts[m])}
            rows += optimizer_rows(su, m, opts[m], knobs, steps)
            continue
        built = _build(table[m], sweep, fixed, methods is not None, layered, notes)
        rows += [_row(su, table[m], hp, c) for hp, c in built or ()]
    if not rows:
        raise ValueError("no method left to plan")
    return Plan(workload, net, workers, float(device_flops), su.compute, rows, notes)


__all__ = [
    "Method",
    "Row",
    "Plan",
    "all_methods",
    "knob_names",
    "settings",
    "identity_name",
    "kind_of",
    "per_tensor",
    "payload_leaf_bytes",
    "calls",
    "flat",
    "compressed_tensors",
    "constant",
    "plan",
    "BACKWARD_SHARE",
    "FUSION_BYTES",
    "EXTRA_COLLECTIVES",
    "MEAN",
    "MAX_STEPS",
    "optimizer_methods",
    "optimizer_params",
    "optimizer_stages",
    "optimizer_rows",
    "stage_calls",
]
