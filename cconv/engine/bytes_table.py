"""Bytes per worker per step for every registered compressor at several worker counts (no
training needed).

    python -m cconv.engine.bytes_table                    # the default MLP on 8x8 digits
    python -m cconv.engine.bytes_table --model resnet8 --input 32,32,3 --workers 2 4 8
    python -m cconv.engine.bytes_table --architecture all-to-all parameter-server --ratio 0.001

Rows come from the compressor registry: each entry's first test case (at density ``--ratio``
where the entry sets its density, ``Entry.at_density``), with error feedback where the
compressor is biased, plus one row per extra collective its entry lists (``collectives``, e.g.
gTop-k), for each architecture asked for.  A configuration the engine rejects (e.g. gTop-k on
the parameter-server architecture) is "n/a".  Each cell comes from ``trainer.traffic(step)``:
the engine's own trace-time ledger of the payload arrays handed to the collectives (the same
numbers the HLO test checks against the compiled program), gradient exchange and model-state
averaging included, metric logging not.
"""

from __future__ import annotations

import argparse

import jax
import optax

from cconv import compressors as C
from cconv import memory as M
from cconv.comm.aggregation import TRANSPORTS
from cconv.engine.config import IDENTITY, EngineConfig
from cconv.engine.trainer import build


def _hparams(entry, case: dict, ratio: float) -> dict:
    """The case at density ``ratio`` where its entry sets the density (``Entry.at_density``)."""
    return entry.at_density(case, ratio) if entry.at_density is not None else dict(case)


def default_rows(ratio: float = 0.01, architectures=("all-to-all",)) -> list[tuple[str, dict]]:
    """(label, EngineConfig keyword arguments) for every registered compressor (the uncompressed
    baseline first), see the module docstring."""
    names = [IDENTITY] + [n for n in C.names() if n != IDENTITY]
    rows = []
    for arch in architectures:
        prefix = "" if arch == "all-to-all" else f"{arch}: "
        for name in names:
            e = C.entry(name)
            hp = _hparams(e, e.example, ratio)
            c = e.build(**hp)
            memory = "ef" if not c.unbiased else M.NONE
            what = " ".join([name, *(f"{k}={v}" for k, v in hp.items())])
            kw = dict(compressor=c, memory=memory, architecture=arch)
            tail = " + EF" if memory == "ef" else ""
            rows.append((f"{prefix}{what}{tail}", kw))
            for coll in e.collectives:
                if arch == "all-to-all":
                    rows.append((f"{prefix}{what} {coll}{tail}", {**kw, "collective": coll}))
    return rows


def bytes_table(params, model_state=None, workers=(2, 4, 8), rows=None, devices=None):
    """{label: {P: (sent, received)}} for the worker that reports (a non-server one under PS);
    a configuration the engine rejects for some P is left out of that row."""
    out = {}
    for label, kw in default_rows() if rows is None else rows:
        out[label] = {}
        for p in workers:
            try:
                engine_cfg = EngineConfig(workers=p, **kw)
            except ValueError:
                continue
            tr = build(lambda *a: None, params, optax.sgd(0.1), engine_cfg, model_state=model_state, devices=devices)
            sent, recv = tr.traffic(0)
            r = TRANSPORTS[engine_cfg.architecture].report_rank(p)
            out[label][p] = (float(sent[r]), float(recv[r]))
    return out


def markdown(table, workers) -> str:
    head = "| method | " + " | ".join(f"P={p} sent / recv" for p in workers) + " |"
    lines = [head, "|---|" + "---:|" * len(workers)]
    for label, row in table.items():
        cells = [f"{row[p][0]:,.0f} / {row[p][1]:,.0f}" if p in row else "n/a" for p in workers]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="bytes per worker per step for each compressor")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--input", default="64", help="input shape, comma separated")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--ratio", type=float, default=0.01, help="density of the compressors with a ratio")
    ap.add_argument("--architecture", nargs="+", default=["all-to-all"], choices=list(TRANSPORTS))
    args = ap.parse_args(argv)
    from cconv import models

    spec = models.build(args.model, tuple(int(v) for v in args.input.split(",")), args.classes, jax.random.PRNGKey(0))
    n = sum(x.size for x in jax.tree.leaves(spec.params))
    devices = [jax.devices()[0]] * max(args.workers)  # traffic() needs no real devices
    rows = default_rows(args.ratio, tuple(args.architecture))
    print(f"{args.model}: {n:,} parameters ({4 * n:,} bytes fp32); bytes per worker per step\n")
    print(markdown(bytes_table(spec.params, spec.model_state, args.workers, rows, devices=devices), args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
