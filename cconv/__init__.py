"""cconv: gradient compression for data-parallel training in JAX, measured in real bytes.

Layers (one direction of dependency):
compressors -> memory -> comm (collectives, byte accounting) -> engine -> experiments / CLI.
"""

from cconv import compressors, memory

__version__ = "0.1.0"
__all__ = [
    "compressors",
    "memory",
    "data",
    "models",
    "comm",
    "engine",
    "distributed",
    "Exchange",
    "as_optax",
    "state_specs",
    "init_state",
    "check_specs",
    "worker_key",
    "sync_model_state",
    "nnx_split",
    "nnx_shard",
    "traffic",
    "advise",
    "__version__",
]

_LAZY = (
    "data",
    "models",
    "comm",
    "engine",
    "distributed",
)  # imported on first use: `import cconv` stays free of flax/sklearn
_DROPIN = ("Exchange", "as_optax")
_DDP = (
    "state_specs",
    "init_state",
    "check_specs",
    "worker_key",
    "sync_model_state",
    "nnx_split",
    "nnx_shard",
    "traffic",
)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"cconv.{name}")
    if name == "advise":  # the advisor (cconv.advisor.advise; `cconv advise`)
        from cconv.advisor import advise

        return advise
    if name in _DROPIN:  # the drop-in API (cconv.engine.dropin)
        from cconv.engine import dropin

        return getattr(dropin, name)
    if name in _DDP:  # what DDP users take for granted, around the drop-in API (cconv.engine.ddp)
        from cconv.engine import ddp

        return getattr(ddp, name)
    raise AttributeError(f"module 'cconv' has no attribute {name!r}")
