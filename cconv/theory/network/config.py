"""``from_config``: a network from a run config's ``network:`` field (preset name or mapping)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cconv._text import shown_names
from cconv.theory.network.links import Hierarchical, Network, _validate
from cconv.theory.network.presets import get, names

_CONFIG_KEYS = (
    "name",
    "preset",
    "alpha",
    "beta",
    "latency_us",
    "bandwidth_gbps",
    "bandwidth_GBps",
    "intra",
    "inter",
    "per_node",
)


def from_config(cfg: Any) -> Network | Hierarchical:
    """A Network from a run config's ``network:`` field.

    Accepted forms::

        "10GbE"                                           # a preset name
        {"preset": "100GbIB"}                             # the same
        {"name": "mine", "alpha": 2e-5, "beta": 1e-10}    # SI units: s, s/byte
        {"name": "mine", "latency_us": 20, "bandwidth_gbps": 25}   # us, Gb/s (10^9 bit/s)
        {"name": "mine", "latency_us": 20, "bandwidth_GBps": 3.1}  # us, GB/s (10^9 byte/s)
        {"name": "dgx", "intra": "NVLink", "inter": {...}, "per_node": 8}   # two levels
    """
    if isinstance(cfg, (Network, Hierarchical)):
        return cfg
    if isinstance(cfg, str):
        return get(cfg)
    if not isinstance(cfg, Mapping):
        raise ValueError(
            f"network config must be a preset name or a mapping, got {type(cfg).__name__}; "
            f"presets: {', '.join(names())}"
        )
    unknown = sorted(set(cfg) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"network config: unknown key(s) {shown_names(unknown)}; valid: {', '.join(_CONFIG_KEYS)}")
    if any(k in cfg for k in ("intra", "inter", "per_node")):
        return _two_level(cfg)
    if "preset" in cfg:
        if len(cfg) > 1 + ("name" in cfg):
            raise ValueError("network config: 'preset' cannot be combined with alpha/beta/latency/bandwidth")
        net = get(cfg["preset"])
        return net._replace(name=str(cfg.get("name", net.name)))
    name = str(cfg.get("name", "custom"))
    has_si = "alpha" in cfg or "beta" in cfg
    has_units = "latency_us" in cfg or "bandwidth_gbps" in cfg or "bandwidth_GBps" in cfg
    if has_si and has_units:
        raise ValueError("network config: give either alpha/beta or latency_us/bandwidth_*, not both")
    if has_si:
        if "alpha" not in cfg or "beta" not in cfg:
            raise ValueError("network config: needs both alpha (s per message) and beta (s per byte)")
        return _validate(name, cfg["alpha"], cfg["beta"])
    return _from_units(name, cfg)


def _two_level(cfg: Mapping) -> Hierarchical:
    """``{"name", "intra", "inter", "per_node"}``: each level a single-level network config."""
    if any(k not in cfg for k in ("intra", "inter", "per_node")) or set(cfg) - {"name", "intra", "inter", "per_node"}:
        raise ValueError("network config: a two-level network needs exactly name, intra, inter, per_node")
    g = cfg["per_node"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"network config: per_node must be an integer >= 1, got {g!r}")
    intra, inter = from_config(cfg["intra"]), from_config(cfg["inter"])
    if not (isinstance(intra, Network) and isinstance(inter, Network)):
        raise ValueError("network config: intra and inter must be single-level networks")
    return Hierarchical(str(cfg.get("name", "custom")), intra, inter, g)


def _from_units(name: str, cfg: Mapping) -> Network:
    """``latency_us`` (us) and one of ``bandwidth_gbps`` (10^9 bit/s), ``bandwidth_GBps`` (10^9 byte/s)."""
    if "latency_us" not in cfg or ("bandwidth_gbps" in cfg) == ("bandwidth_GBps" in cfg):
        raise ValueError("network config: needs latency_us and exactly one of bandwidth_gbps, bandwidth_GBps")
    for key in ("latency_us", "bandwidth_gbps", "bandwidth_GBps"):
        v = cfg.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"network config: {key} must be a finite number >= 0, got {v!r}")
    bytes_per_s = cfg["bandwidth_gbps"] * 1e9 / 8 if "bandwidth_gbps" in cfg else cfg["bandwidth_GBps"] * 1e9
    if bytes_per_s <= 0:
        raise ValueError("network config: bandwidth must be > 0")
    return _validate(name, cfg["latency_us"] * 1e-6, 1.0 / bytes_per_s)
