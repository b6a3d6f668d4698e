"""``cconv calibrate --out FILE``: measure this machine's device into a profile that ``cconv plan
--device-profile FILE`` reads (``cconv.theory.device_profile``: sustained FLOP/s, memory bandwidth,
launch overhead, and each compressor's compress/decompress cost at several sizes)."""

from __future__ import annotations

import argparse
import sys

from cconv.cli_schema import Command, Option, error_line
from cconv.theory import device_profile as DP
from cconv.theory.plan_cli import _int_in, _list


def run(args: argparse.Namespace) -> int:
    """Measure and write the profile; 0 on success, 2 with one line on stderr for bad input."""
    try:
        if args.out is None:
            raise ValueError("--out FILE is required (the profile to write)")
        methods = [m.strip() for m in (args.methods or ",".join(DP.default_methods())).split(",") if m.strip()]
        if not methods:
            raise ValueError("--methods is empty")
        DP.check_out(args.out)  # before minutes of measuring
        profile = DP.measure(methods, list(args.sizes or DP.DEFAULT_SIZES), args.repeats or 5)
        DP.write(args.out, profile)
    except ValueError as e:
        print(error_line(str(e)), file=sys.stderr)
        return 2
    d = profile["device"]
    print(
        f"{args.out}: {d['name']}: {d['flops']:.3g} FLOP/s, {d['mem_bw'] / 1e9:.3g} GB/s, "
        f"launch {d['launch_s'] * 1e6:.1f} us; {len(profile['compressors'])} compressor(s) at "
        f"{len(next(iter(profile['compressors'].values())))} size(s)"
    )
    return 0


OPTIONS = (
    Option("--out", metavar="FILE", help="the profile to write (JSON; required; replaces only a profile)"),
    Option("--methods", metavar="M1,M2", help="compressors to time (default topk,randomk,signsgd,qsgd,powersgd)"),
    Option(
        "--sizes",
        type=_list(_int_in(DP.MAX_SIZE)),
        metavar="N1,N2",
        help="tensor sizes to time them at, each >= 1000 (default 10000,100000,1000000)",
    ),
    Option("--repeats", type=_int_in(1000), help="timed calls per measurement, median taken (default 5)"),
)

COMMAND = Command(
    "calibrate",
    help="measure this device into a profile for cconv plan --device-profile",
    description=__doc__.split("\n\n")[0],
    options=OPTIONS,
    handler=run,
)
