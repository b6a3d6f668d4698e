"""The method sets of ``cconv plan --methods NAME``: NAME -> the function that gives its rows.

Each function is called as ``fn(workload, workers, net, device_flops, servers=..., interference=...,
topology=...)`` and returns rows with at least ``method``, ``iter_s``, ``speedup`` and
``comm_exposed_s``.  A new set is one entry here.  This module sits above the modules it names
(``survey`` and ``compressed`` import neither it nor each other's consumers), so the table needs no
import inside a function.
"""

from __future__ import annotations

from collections.abc import Callable

from cconv.theory.schedule import compressed, survey

METHOD_SETS: dict[str, Callable[..., list]] = {
    "survey": survey.rows,  # the survey's seven lossless methods
    "all": compressed.rows,  # every survey method x every compressor (open problem 5.4)
}

__all__ = ["METHOD_SETS"]
