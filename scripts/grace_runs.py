"""Extract the GRACE runs cconv checks its time model on from the GRACE data release.

    python scripts/grace_runs.py GRACE_data_release.pickle > cconv/theory/grace_runs.json

The release (github.com/sands-lab/grace-data, Xu et al., "GRACE: A Compressed Communication
Framework for Distributed Machine Learning", ICDCS 2021) is a pickle of pandas DataFrames; this
reads it without pandas (a restricted unpickler that rebuilds the columns from the pickled blocks)
and keeps the ImageNet ResNet-50 runs in mode 'throughput' on the 'mcnodes' testbed (one V100 per
server over TCP) whose compressor cconv has, mapped by the names GRACE gives them (the entries'
``known_as``): dense, top-k, random-k, signSGD, DGC, PowerSGD, QSGD and TernGrad, each at its
published knob value.  Nothing is fitted here.
"""

from __future__ import annotations

import array
import json
import pickle
import sys

# GRACE's run name -> (its compressor class, our knob name) ; knob value parsed from "name=value"
METHODS = {
    "none": (None, None),
    "topk_ratio": ("grace:TopKCompressor", "ratio"),
    "randomk_ratio": ("grace:RandomKCompressor", "ratio"),
    "randomk_mem_ratio": ("grace:RandomKCompressor", "ratio"),  # with error feedback ("EF" in the label)
    "topk_mem_ratio": ("grace:TopKCompressor", "ratio"),
    "signsgd": ("grace:SignSGDCompressor", None),
    "dgc_mem_ratio": ("grace:DgcCompressor", "ratio"),
    "powersgd_mem": ("grace:PowerSGDCompressor", None),  # rank 1 (GRACE's helper default compress_rank)
    "qsgd_q": ("grace:QSGDCompressor", "levels"),
    "terngrad": ("grace:TernGradCompressor", None),
}
LABELS = {
    None: "dense",
    "grace:TopKCompressor": "top-k",
    "grace:RandomKCompressor": "random-k",
    "grace:SignSGDCompressor": "signSGD",
    "grace:DgcCompressor": "DGC",
    "grace:PowerSGDCompressor": "PowerSGD r=1",
    "grace:QSGDCompressor": "QSGD",
    "grace:TernGradCompressor": "TernGrad",
}


class _Obj:
    def __init__(self, *args):
        self.args, self.state = args, None

    def __setstate__(self, state):
        self.state = state


class _Array(_Obj):
    def values(self) -> list:
        _, _shape, dtype, _fortran, raw = self.state
        code = dtype.args[0]
        if code.startswith("O"):
            return list(raw)
        out = array.array({"f8": "d", "i8": "q"}[code])
        out.frombytes(raw)
        return list(out)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("numpy"):
            return {
                "_reconstruct": lambda cls, shape, dt: _Array(),
                "dtype": lambda *a: _Obj(*a),
                "ndarray": "ndarray",
                "scalar": lambda dt, raw: raw,
            }[name]
        if module.startswith("pandas"):
            if name == "_new_Index":
                return lambda cls, d: d
            return type(name, (_Obj,), {})
        if module == "builtins" and name == "slice":
            return slice
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _rows(frame) -> list[dict]:
    state = frame.state["_data"].state[3]["0.14.1"]
    cols = state["axes"][0]["data"].values()
    nrow = state["axes"][1]["stop"]
    data = {}
    for block in state["blocks"]:
        vals, locs = block["values"].values(), block["mgr_locs"]
        locs = locs.values() if isinstance(locs, _Array) else range(locs.start or 0, locs.stop, locs.step or 1)
        for j, c in enumerate(locs):
            data[cols[c]] = vals[j * nrow : (j + 1) * nrow]
    return [{c: data[c][i] for c in cols} for i in range(nrow)]


def _method(name: str):
    base, _, value = name.partition("=")
    if base not in METHODS:
        return None
    alias, knob = METHODS[base]
    if base == "powersgd_mem":
        return alias, [["rank", 1]]  # GRACE's helper: compress_rank defaults to 1
    if base == "qsgd_q" and int(value) > 127:
        return None  # cconv's QSGD codes levels in a signed byte (<= 127)
    return alias, ([[knob, float(value) if knob == "ratio" else int(value)]] if knob else [])


def runs(path: str) -> list[dict]:
    with open(path, "rb") as f:
        frames = _Unpickler(f).load()
    out = []
    for r in _rows(frames["imagenet-classification"]):
        if (r["model"], r["mode"], r["env"]) != ("resnet50", "throughput", "mcnodes"):
            continue
        m = _method(r["name"])
        if m is None or r["workers"] < 2:
            continue
        alias, knobs = m
        ef = " EF" if r["name"].startswith(("randomk_mem", "topk_mem")) else ""
        what = LABELS[alias] + "".join(f" {v:g}" for k, v in knobs if k != "rank") + ef
        label = f"{r['workers']}x1 {r['bw'].replace('g', ' Gbit/s')} {what} ({r['backend'].upper()})"
        out.append(
            {
                "label": label,
                "method": alias,
                "knobs": knobs,
                "ips": round(float(r["total_images_per_sec"]), 2),
                "run": r["id"],
                "workers": int(r["workers"]),
                "gbps": float(r["bw"].rstrip("g")),
                "backend": r["backend"],
            }
        )
    return sorted(out, key=lambda x: (x["gbps"], x["workers"], x["backend"], x["label"]))


if __name__ == "__main__":
    json.dump(runs(sys.argv[1]), sys.stdout, indent=1)
    sys.stdout.write("\n")
