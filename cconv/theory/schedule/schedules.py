"""The DAG of a training iteration under a communication schedule, and its simulated time.

Input: the layers in BACKPROP order (index 0 = the last layer, whose gradient appears first),
each a ``LayerCost`` in seconds and bytes: forward and backward time on the device (FLOPs /
device FLOP/s, ``layer_costs``), the message its gradient sends (``kind``, ``nbytes``; ``kind``
None = the architecture's summable exchange, ``"allreduce"``), and optional ``compress_s`` /
``decompress_s`` on the compute stream (compression inside the schedule).

The DAG of iteration k (resource ``compute`` unless said otherwise):

* forward of the layers in forward order, then backward in backprop order (a chain);
* compress(l) after backward(l), ahead of the next backward (same stream);
* the messages (the schedule decides which layers each carries, its priority and release
  time) after backward/compress of every layer they carry, as a chain of stages on the
  architecture's resources (``arch.py``);
* decompress(l) after every message carrying l;
* iteration k+1's forward of layer l waits for the end of iteration k's backward and, under a
  barrier (every schedule but ByteScheduler), for all of iteration k's communication (the
  optimizer step after ``synchronize``), else only for layer l's own messages.

Schedules (``SCHEDULES``; a protocol and one object each):

* ``BSP``: all communication after backprop, the gradient fused into one message per kind
  (the planner's ``fused`` BSP; a PS pushes all of it, then pulls all of it).
* ``WFBP`` (Zhang et al. 2017, Poseidon): one message per layer as soon as its gradient is
  ready, first come first served.
* ``Fusion`` (Horovod, Sergeev & Del Balso 2018): every ``cycle_s`` the background thread fuses
  the gradients that became ready since the last cycle into buffers of at most ``buffer_bytes``.
* ``MGWFBP`` (Shi, Chu & Li, INFOCOM 2019): merge consecutive layers so that the last message
  ends as early as possible.  With r_j the ready time of layer j (backprop order) and T(n) the
  message cost, the best end of the first i layers is

      f(0) = 0,   f(i) = min_{j < i} max(r_{i-1}, f(j)) + T(n_j + ... + n_{i-1})

  exact because the end of later messages is non-decreasing in f(j) (dynamic programming over
  the 2^(L-1) contiguous merges; the paper's Theorem 1 characterises the same optimum).
* ``ByteScheduler`` (Peng et al., SOSP 2019): every message cut into partitions of at most
  ``partition_bytes``; a partition's priority is its layer's position in the forward pass (the
  next forward needs layer 1 first); at most ``credit`` partitions in flight (taken when the
  first stage starts, returned when the last ends); no barrier: the next iteration's forward of
  layer l waits only for layer l's partitions.  Its iteration time is the steady state: the
  interval between the starts of the last two of ``iterations`` simulated iterations.

GPU interference (``run(..., interference=kappa)``, default 0): a communication stage on one of
the architecture's ``gpu_resources`` (NCCL's collectives, BytePS's PCIe stages) also puts a task
of kappa x its time on the compute stream, ready with the stage (after the stage's dependencies
and the previous stage on that resource) and ahead of the remaining backward: communication that
overlaps computation slows it.  Under BSP the compute stream is idle then, so it costs nothing.
MG-WFBP's merge is optimal for kappa = 0 (the interference is not in its cost model).

``Result``: ``iter_s`` (iteration time), ``compute_s`` (busy time of the compute stream per
iteration), ``comm_exposed_s`` = iter_s - compute_s, and the events of the simulation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from cconv.theory.schedule import arch as A
from cconv.theory.schedule.sim import Event, Task, simulate

BIG = 1e9  # priority offset per iteration (earlier iterations first)


class LayerCost(NamedTuple):
    """One layer in backprop order: seconds on the device and the message of its gradient."""

    name: str
    fwd_s: float
    bwd_s: float
    nbytes: float
    compress_s: float = 0.0
    decompress_s: float = 0.0
    kind: str | None = None  # None: the architecture's summable exchange ("allreduce")
    reply_bytes: float | None = None  # a parameter server's reply to a gathered payload, per worker:
    # the dense sum (cconv's engine) or its downlink-compressed form; None: nbytes


class Message(NamedTuple):
    """What a schedule sends: the layers it carries (backprop indices) and when it may go."""

    layers: tuple[int, ...]
    nbytes: float
    kind: str
    priority: float = 0.0
    release: float = 0.0


class Result(NamedTuple):
    iter_s: float
    compute_s: float
    comm_exposed_s: float
    events: tuple[Event, ...]


def check_layers(layers: Sequence[LayerCost]) -> list[LayerCost]:
    """The layers, validated: at least one, finite sizes >= 0 (one-line ValueError otherwise)."""
    out = list(layers)
    if not out:
        raise ValueError("the layer table is empty")
    for lc in out:
        if not isinstance(lc, LayerCost):
            raise ValueError(f"expected a LayerCost, got {type(lc).__name__}")
        for f in ("fwd_s", "bwd_s", "nbytes", "compress_s", "decompress_s", "reply_bytes"):
            v = getattr(lc, f)
            if f == "reply_bytes" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"layer {lc.name!r}: {f} must be a finite number >= 0, got {v!r}")
    return out


def layer_costs(layers: Sequence, device_flops: float) -> list[LayerCost]:
    """``LayerCost``s from profile layers (name, fwd_flops, bwd_flops, grad_bytes per iteration):
    time = FLOPs / device_flops, the message = the fp32 gradient."""
    if isinstance(device_flops, bool) or not isinstance(device_flops, (int, float)) or not device_flops > 0:
        raise ValueError(f"device_flops must be a number > 0, got {device_flops!r}")
    out = []
    for lay in layers:
        for f in ("fwd_flops", "bwd_flops", "grad_bytes"):
            v = getattr(lay, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"layer {lay.name!r}: {f} must be a finite number >= 0, got {v!r}")
        out.append(LayerCost(lay.name, lay.fwd_flops / device_flops, lay.bwd_flops / device_flops, lay.grad_bytes))
    return out


def _kind(lc: LayerCost) -> str:
    return lc.kind or "allreduce"


def reply_of(lc: LayerCost) -> float:
    """The layer's reply bytes from a parameter server (``nbytes`` when ``reply_bytes`` is not set)."""
    return lc.nbytes if lc.reply_bytes is None else float(lc.reply_bytes)


def message_reply(msg: Message, layers: Sequence[LayerCost]) -> float:
    """The reply a message's layers get from a parameter server, its share (a ByteScheduler
    partition carries the same fraction of its payload and of its reply)."""
    n = sum(layers[j].nbytes for j in msg.layers)
    d = sum(reply_of(layers[j]) for j in msg.layers)
    return d if n <= 0 else d * msg.nbytes / n


def ready_times(layers: Sequence[LayerCost]) -> list[float]:
    """When each layer's gradient (after compress) is ready, from the start of the iteration,
    with the compute stream running forward, then backward + compress per layer."""
    t = sum(lc.fwd_s for lc in layers)
    out = []
    for lc in layers:
        t += lc.bwd_s + lc.compress_s
        out.append(t)
    return out


class Schedule(Protocol):
    name: str
    barrier: bool
    iterations: int

    def messages(self, layers: Sequence[LayerCost], arch: A.Architecture) -> list[Message]: ...

    def pools(self) -> dict[str, int]: ...


class BSP(NamedTuple):
    name: str = "bsp"
    barrier: bool = True
    iterations: int = 1

    def messages(self, layers, arch):
        groups: dict[str, list[int]] = {}
        for j, lc in enumerate(layers):
            groups.setdefault(_kind(lc), []).append(j)
        return [Message(tuple(js), sum(layers[j].nbytes for j in js), k) for k, js in groups.items()]

    def pools(self):
        return {}


class WFBP(NamedTuple):
    name: str = "wfbp"
    barrier: bool = True
    iterations: int = 1

    def messages(self, layers, arch):
        return [Message((j,), lc.nbytes, _kind(lc)) for j, lc in enumerate(layers)]

    def pools(self):
        return {}


class Fusion(NamedTuple):
    """Horovod's tensor fusion: ``buffer_bytes`` (HOROVOD_FUSION_THRESHOLD, 64 MiB) and
    ``cycle_s`` (HOROVOD_CYCLE_TIME, 5 ms in the Horovod of the survey's time).

    ``serial_negotiation`` (``fusion-2017``): the background loop of the Horovod of 2017 (its
    benchmark charts; horovod/tensorflow/mpi_ops.cc, ``BackgroundThreadLoop``) sleeps a fixed 5 ms,
    then negotiates the tick with point-to-point MPI messages through rank 0: each worker sends its
    requests and a DONE to rank 0, which receives them one by one (``MPI_Probe``/``MPI_Recv`` until
    it has size DONEs), then ``MPI_Send``s each fused response and a DONE to every worker in turn.
    A tick carrying one message therefore lasts cycle_s + 3 x ``arch.peer_latency_s`` (rank 0's
    P - 1 receives and 2 (P - 1) sends, each a small message at the link's alpha), a term linear in
    P: at 512 GPUs the ticks are longer and fuse more gradients into each message.  Later Horovods
    negotiate with collectives (MPI_Gather/Bcast, then a cached bit-vector all-reduce), so
    ``fusion`` leaves the term out."""

    buffer_bytes: float = 64 * 2**20
    cycle_s: float = 5e-3
    name: str = "fusion"
    barrier: bool = True
    iterations: int = 1
    serial_negotiation: bool = False

    def period_s(self, arch) -> float:
        """Seconds between two ticks of the background loop (class docstring)."""
        return self.cycle_s + (3.0 * A.peer_latency_s(arch) if self.serial_negotiation else 0.0)

    def messages(self, layers, arch):
        if not (self.buffer_bytes > 0 and self.cycle_s > 0):
            raise ValueError("fusion: buffer_bytes and cycle_s must be > 0")
        ready = ready_times(layers)
        period = self.period_s(arch)
        out: list[Message] = []
        open_: dict[tuple[int, str], list] = {}
        for j, (lc, r) in enumerate(zip(layers, ready)):
            tick = math.ceil(r / period - 1e-12) * period
            key = (tick, _kind(lc))
            cur = open_.get(key)
            if cur is not None and cur[1] + lc.nbytes <= self.buffer_bytes:
                cur[0].append(j)
                cur[1] += lc.nbytes
            else:
                cur = open_[key] = [[j], lc.nbytes, tick, _kind(lc)]
                out.append(cur)  # type: ignore[arg-type]
        return [Message(tuple(c[0]), c[1], c[3], 0.0, c[2]) for c in out]  # type: ignore[index]

    def pools(self):
        return {}


def optimal_merge(
    ready: Sequence[float],
    sizes: Sequence[float],
    kinds: Sequence[str],
    cost,
    reply: Sequence[float] | None = None,
) -> list[tuple[int, ...]]:
    """MG-WFBP's merge: contiguous groups (backprop order) minimising the end of the last message
    on one channel, by the dynamic programme in the module docstring.  ``cost(kind, n)``, or
    ``cost(kind, n, reply_n)`` when ``reply`` (the layers' ``reply_of``) is given."""
    n = len(ready)
    f = [0.0] + [math.inf] * n
    arg = [0] * (n + 1)
    for i in range(1, n + 1):
        total = rtotal = 0.0
        for j in range(i - 1, -1, -1):
            if kinds[j] != kinds[i - 1]:
                break
            total += sizes[j]
            if reply is None:
                c = cost(kinds[i - 1], total)
            else:
                rtotal += reply[j]
                c = cost(kinds[i - 1], total, rtotal)
            end = max(ready[i - 1], f[j]) + c
            if end < f[i] - 1e-15:
                f[i], arg[i] = end, j
    groups, i = [], n
    while i > 0:
        groups.append(tuple(range(arg[i], i)))
        i = arg[i]
    return groups[::-1]


class MGWFBP(NamedTuple):
    name: str = "mg-wfbp"
    barrier: bool = True
    iterations: int = 1

    def messages(self, layers, arch):
        kinds = [_kind(lc) for lc in layers]
        groups = optimal_merge(
            ready_times(layers),
            [lc.nbytes for lc in layers],
            kinds,
            lambda k, n, dn: A.cost(arch, k, n, dn),
            [reply_of(lc) for lc in layers],
        )
        return [Message(g, sum(layers[j].nbytes for j in g), kinds[g[0]]) for g in groups]

    def pools(self):
        return {}


class ByteScheduler(NamedTuple):
    """Peng et al. 2019: ``partition_bytes`` (BytePS's default partition, 4,096,000 bytes),
    ``credit`` partitions in flight, priority by forward position (``priority=False``: FIFO)."""

    partition_bytes: float = 4_096_000
    credit: int = 4
    priority: bool = True
    name: str = "bytescheduler"
    barrier: bool = False
    iterations: int = 3

    def messages(self, layers, arch):
        if not self.partition_bytes > 0:
            raise ValueError("bytescheduler: partition_bytes must be > 0")
        L = len(layers)
        out = []
        for j, lc in enumerate(layers):
            parts = max(1, math.ceil(lc.nbytes / self.partition_bytes)) if math.isfinite(self.partition_bytes) else 1
            prio = float(L - 1 - j) if self.priority else 0.0
            out += [Message((j,), lc.nbytes / parts, _kind(lc), prio) for _ in range(parts)]
        return out

    def pools(self):
        if isinstance(self.credit, bool) or not isinstance(self.credit, int) or self.credit < 1:
            raise ValueError(f"bytescheduler: credit must be an integer >= 1, got {self.credit!r}")
        return {"credit": self.credit}


SCHEDULES = {
    "bsp": BSP(),
    "wfbp": WFBP(),
    "fusion": Fusion(),
    "fusion-2017": Fusion(name="fusion-2017", serial_negotiation=True),
    "mg-wfbp": MGWFBP(),
    "bytescheduler": ByteScheduler(),
}


def get(name: str) -> Schedule:
    if isinstance(name, str) and name.lower() in SCHEDULES:
        return SCHEDULES[name.lower()]
    raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")


def names() -> list[str]:
    return list(SCHEDULES)


class _Ctx(NamedTuple):
    """What every task of iteration ``k`` carries: its index, priority base and start mark."""

    k: int
    base: float
    mark: str
    layers: list[LayerCost]


class _Comm(NamedTuple):
    """How messages become tasks: the architecture, the credit pool's name ("" without one), the
    resources whose stages take a share of the GPU, and that share (kappa)."""

    arch: A.Architecture
    credit: str
    gpu_resources: frozenset[str]
    interference: float


class _After(NamedTuple):
    """What iteration k leaves for k+1's forward: its last backward, the end of every message or
    decompress (a barrier waits for all), and the ends per layer (no barrier: layer j waits for its own)."""

    last_bwd: str
    ends: tuple[str, ...]
    layer_end: dict[int, list[str]]


def _waits(k: int, after: _After, barrier: bool, j: int) -> list[str]:
    """The tasks of iteration k-1 that iteration k's forward of layer j waits for."""
    if k == 0:
        return []
    return [after.last_bwd, *(after.ends if barrier else after.layer_end.get(j, []))]


def _compute_tasks(ctx: _Ctx, waits) -> tuple[list[Task], dict[int, str], str]:
    """Forward in forward order (backprop index L-1 first), then backward and compress per layer
    in backprop order; the task after which each layer's gradient is ready; the last backward."""
    k, base, L = ctx.k, ctx.base, len(ctx.layers)
    tasks, prev = [], ""
    for f in range(L):
        j = L - 1 - f
        name = f"it{k}/fwd/{j}"
        deps = tuple(waits(j) + [prev or ctx.mark])
        tasks.append(Task(name, "compute", ctx.layers[j].fwd_s, deps, base + f, kind="forward", layer=j, iteration=k))
        prev = name
    ready: dict[int, str] = {}
    for j, lc in enumerate(ctx.layers):
        name = f"it{k}/bwd/{j}"
        tasks.append(Task(name, "compute", lc.bwd_s, (prev,), base + L + j, kind="backward", layer=j, iteration=k))
        prev = ready[j] = name
        if lc.compress_s > 0:
            ready[j] = f"it{k}/cmp/{j}"
            prio = base + L + j + 0.5
            tasks.append(Task(ready[j], "compute", lc.compress_s, (name,), prio, kind="compress", layer=j, iteration=k))
    return tasks, ready, prev


def _release_dep(ctx: _Ctx, release: float, delays: dict[float, str], tasks: list[Task]) -> tuple[str, ...]:
    """A message released ``release`` seconds after the iteration's start waits for a delay task
    (one per distinct release time); none for ``release`` 0."""
    if release <= 0:
        return ()
    if release not in delays:
        delays[release] = f"it{ctx.k}/delay{len(delays)}"
        tasks.append(Task(delays[release], delays[release], release, (ctx.mark,), kind="mark", iteration=ctx.k))
    return (delays[release],)


def _stage_tasks(
    ctx: _Ctx, comm: _Comm, prefix: str, msg: Message, dep: tuple[str, ...], last_on: dict[str, str]
) -> tuple[list[Task], tuple[str, ...]]:
    """A message's stages as a chain on the architecture's resources (the credit taken by the first,
    returned by the last), each on a GPU resource with its interference task on the compute
    stream; the chain's end."""
    tasks = []
    stages = comm.arch.stages(msg.kind, msg.nbytes, message_reply(msg, ctx.layers))
    for s, (res, t) in enumerate(stages):
        name = f"{prefix}/s{s}"
        if comm.interference > 0 and res in comm.gpu_resources and t > 0:  # the kernels' share of the GPU
            after = dep + ((last_on[res],) if res in last_on else ())
            kw = {"kind": "interference", "layer": msg.layers[0], "iteration": ctx.k}
            tasks.append(Task(f"{name}/gpu", "compute", comm.interference * t, after, ctx.base - 0.5, **kw))
        last_on[res] = name
        take, give = comm.credit if s == 0 else "", comm.credit if s == len(stages) - 1 else ""
        prio = ctx.base + msg.priority
        tasks.append(Task(name, res, t, dep, prio, 0.0, take, give, "comm", msg.layers[0], ctx.k))
        dep = (name,)
    return tasks, dep


def _message_tasks(
    ctx: _Ctx, msgs: Sequence[Message], ready: dict[int, str], comm: _Comm
) -> tuple[list[Task], dict[int, list[str]]]:
    """Every message after the gradients it carries (and its release time); the end of each
    layer's messages."""
    tasks: list[Task] = []
    layer_end: dict[int, list[str]] = {}
    delays: dict[float, str] = {}
    last_on: dict[str, str] = {}
    for m, msg in enumerate(msgs):
        dep = tuple(ready[j] for j in msg.layers) + _release_dep(ctx, msg.release, delays, tasks)
        stages, dep = _stage_tasks(ctx, comm, f"it{ctx.k}/msg{m}", msg, dep, last_on)
        tasks += stages
        for j in msg.layers:
            layer_end.setdefault(j, []).append(dep[0])
    return tasks, layer_end


def _decompress_tasks(ctx: _Ctx, ready: dict[int, str], layer_end: dict[int, list[str]]) -> list[Task]:
    """Decompress of each layer after all its messages; it becomes the layer's end (``layer_end``
    is updated)."""
    tasks, L = [], len(ctx.layers)
    for j, lc in enumerate(ctx.layers):
        if lc.decompress_s > 0:
            d = f"it{ctx.k}/dec/{j}"
            deps = tuple(layer_end.get(j, [ready[j]]))
            kw = {"kind": "decompress", "layer": j, "iteration": ctx.k}
            tasks.append(Task(d, "compute", lc.decompress_s, deps, ctx.base + 2 * L + j, **kw))
            layer_end[j] = [d]
    return tasks


def _iteration(ctx: _Ctx, msgs: Sequence[Message], comm: _Comm, waits) -> tuple[list[Task], _After]:
    """The tasks of one iteration and what the next one waits for."""
    tasks, ready, last_bwd = _compute_tasks(ctx, waits)
    comm_tasks, layer_end = _message_tasks(ctx, msgs, ready, comm)
    tasks += comm_tasks + _decompress_tasks(ctx, ready, layer_end)
    ends = tuple(e for j in range(len(ctx.layers)) for e in layer_end.get(j, []))
    return tasks, _After(last_bwd, ends, layer_end)


def build(
    layers: Sequence[LayerCost],
    schedule: Schedule,
    arch: A.Architecture,
    iterations: int | None = None,
    interference: float = 0.0,
) -> tuple[list[Task], dict[str, int], list[str]]:
    """The tasks of ``iterations`` iterations, the pools, and the names of the marks (zero-length
    tasks at the moment each iteration's first forward may start; marks[k] for k = 0..K)."""
    layers = check_layers(layers)
    K = schedule.iterations if iterations is None else iterations
    msgs = schedule.messages(layers, arch)
    pools = schedule.pools()
    gpu = frozenset(getattr(arch, "gpu_resources", ()))
    comm = _Comm(arch, "credit" if "credit" in pools else "", gpu, interference)
    tasks: list[Task] = []
    marks: list[str] = []
    after = _After("", (), {})
    for k in range(K + 1):
        waits = functools.partial(_waits, k, after, schedule.barrier)
        marks.append(f"it{k}/start")
        tasks.append(Task(marks[-1], f"mark{k}", 0.0, tuple(waits(len(layers) - 1)), kind="mark", iteration=k))
        if k < K:
            more, after = _iteration(_Ctx(k, k * BIG, marks[-1], layers), msgs, comm, waits)
            tasks += more
    return tasks, pools, marks


def run(
    layers: Sequence[LayerCost],
    schedule: Schedule | str,
    arch: A.Architecture,
    iterations: int | None = None,
    interference: float = 0.0,
) -> Result:
    """Simulate; the iteration time is the interval between the last two marks.  ``interference``
    (kappa >= 0): every communication stage on one of the architecture's ``gpu_resources`` also
    takes kappa x its time of the compute stream (module docstring)."""
    if isinstance(interference, bool) or not isinstance(interference, (int, float)) or not 0 <= interference < math.inf:
        raise ValueError(f"interference must be a finite number >= 0, got {interference!r}")
    if isinstance(schedule, str):
        schedule = get(schedule)
    layers = check_layers(layers)
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1):
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    tasks, pools, marks = build(layers, schedule, arch, iterations, float(interference))
    events = simulate(tasks, pools)
    start = {e.task.name: e.start for e in events if e.task.kind == "mark"}
    it = start[marks[-1]] - start[marks[-2]]
    compute = sum(lc.fwd_s + lc.bwd_s + lc.compress_s + lc.decompress_s for lc in layers)
    return Result(it, compute, max(0.0, it - compute), tuple(events))


__all__ = [
    "LayerCost",
    "Message",
    "Result",
    "Schedule",
    "BSP",
    "WFBP",
    "Fusion",
    "MGWFBP",
    "ByteScheduler",
    "SCHEDULES",
    "get",
    "names",
    "build",
    "run",
    "layer_costs",
    "ready_times",
    "optimal_merge",
    "check_layers",
    "reply_of",
    "message_reply",
]
