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


def from_config(spec: Any) -> Network | Hierarchical:
    """A Network from a run config's ``network:`` field.

    Accepted forms::

        "10GbE"                                           # a preset name
        {"preset": "100GbIB"}                             # the same
        {"name": "mine", "alpha": 2e-5, "beta": 1e-10}    # SI units: s, s/byte
        {"name": "mine", "latency_us": 20, "bandwidth_gbps": 25}   # us, Gb/s (10^9 bit/s)
        {"name": "mine", "latency_us": 20, "bandwidth_GBps": 3.1}  # us, GB/s (10^9 byte/s)
        {"name": "dgx", "intra": "NVLink", "inter": {...}, "per_node": 8}   # two levels
    """
    if isinstance(spec, (Network, Hierarchical)):
        return spec
    if isinstance(spec, str):
        return get(spec)
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"network config must be a preset name or a mapping, got {type(spec).__name__}; "
            f"presets: {', '.join(names())}"
        )
    unknown = sorted(set(spec) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"network config: unknown key(s) {shown_names(unknown)}; valid: {', '.join(_CONFIG_KEYS)}")
    if any(k in spec for k in ("intra", "inter", "per_node")):
        return _two_level(spec)
    if "preset" in spec:
        if len(spec) > 1 + ("name" in spec):
            raise ValueError("network config: 'preset' cannot be combined with alpha/beta/latency/bandwidth")
        net = get(spec["preset"])
        return net._replace(name=str(spec.get("name", net.name)))
    name = str(spec.get("name", "custom"))
    has_si = "alpha" in spec or "beta" in spec
    has_units = "latency_us" in spec or "bandwidth_gbps" in spec or "bandwidth_GBps" in spec
    if has_si and has_units:
        raise ValueError("network config: give either alpha/beta or latency_us/bandwidth_*, not both")
    if has_si:
        if "alpha" not in spec or "beta" not in spec:
            raise ValueError("network config: needs both alpha (s per message) and beta (s per byte)")
        return _validate(name, spec["alpha"], spec["beta"])
    return _from_units(name, spec)


def _two_level(spec: Mapping) -> Hierarchical:
    """``{"name", "intra", "inter", "per_node"}``: each level a single-level network config."""
    if any(k not in spec for k in ("intra", "inter", "per_node")) or set(spec) - {"name", "intra", "inter", "per_node"}:
        raise ValueError("network config: a two-level network needs exactly name, intra, inter, per_node")
    g = spec["per_node"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ValueError(f"network config: per_node must be an integer >= 1, got {g!r}")
    intra, inter = from_config(spec["intra"]), from_config(spec["inter"])
    if not (isinstance(intra, Network) and isinstance(inter, Network)):
        raise ValueError("network config: intra and inter must be single-level networks")
    return Hierarchical(str(spec.get("name", "custom")), intra, inter, g)


def _from_units(name: str, spec: Mapping) -> Network:
    """``latency_us`` (us) and one of ``bandwidth_gbps`` (10^9 bit/s), ``bandwidth_GBps`` (10^9 byte/s)."""
    if "latency_us" not in spec or ("bandwidth_gbps" in spec) == ("bandwidth_GBps" in spec):
        raise ValueError("network config: needs latency_us and exactly one of bandwidth_gbps, bandwidth_GBps")
    for key in ("latency_us", "bandwidth_gbps", "bandwidth_GBps"):
        v = spec.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"network config: {key} must be a finite number >= 0, got {v!r}")
    bytes_per_s = spec["bandwidth_gbps"] * 1e9 / 8 if "bandwidth_gbps" in spec else spec["bandwidth_GBps"] * 1e9
    if bytes_per_s <= 0:
        raise ValueError("network config: bandwidth must be > 0")
    return _validate(name, spec["latency_us"] * 1e-6, 1.0 / bytes_per_s)
