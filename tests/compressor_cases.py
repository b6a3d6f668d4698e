"""Further test cases of the registered compressors, keyed by registered name.

The generic tests (``tests/registry_cases.py``) run every registered compressor with its entry's
``example`` (the fast tier; ``{}``: its defaults), then the further cases listed here (``slow`` and
``extended``: the options they exercise have their own test modules, e.g. tests/test_golomb.py,
tests/test_qsgd_elias.py).  Test cases are the tests' concern, not the compressor's: a new
compressor needs no line here (its ``example`` covers it; a required hyper-parameter goes there),
and a test module may pass its own (``registry_cases.cases(further=...)``).
"""

FURTHER: dict[str, tuple[dict, ...]] = {
    "dgc": ({"ratio": 0.05, "positions": "golomb"},),
    "drive": ({"unbiased": False},),
    "eden": ({"bits": 1, "unbiased": False}, {"bits": 3}, {"bits": 4, "unbiased": False}),
    "onebit": ({"columns": True},),
    "powersgd": ({"rank": 1},),
    "qsgd": ({"levels": 2, "bucket": 6}, {"levels": 2, "bucket": 6, "coding": "elias"}),
    "randomk": (
        {"ratio": 0.2, "scaled": False, "shared": False},
        {"k": 3, "scaled": False},
        {"ratio": 0.2, "shared": False, "positions": "golomb"},
    ),
    "stc": ({"k": 3}, {"ratio": 0.2, "positions": "golomb"}),
    "terngrad": ({"clip": 2.5}, {"shared_scale": True}),
    "thc": ({"bits": 2, "table": "table"},),
    "threshold": ({"tau": 0.1},),
    "topk": ({"k": 5}, {"ratio": 0.2, "positions": "golomb"}),
}
