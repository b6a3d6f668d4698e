"""cconv: gradient compression for data-parallel training in JAX, measured in real bytes.

Layers (one direction of dependency):
compressors -> memory -> comm (collectives, byte accounting) -> engine -> experiments / CLI.
"""

from cconv import compressors, memory

__version__ = "0.1.0"
__all__ = ["compressors", "memory", "data", "models", "comm", "engine", "distributed", "__version__"]

_LAZY = (
    "data",
    "models",
    "comm",
    "engine",
    "distributed",
)  # imported on first use: `import cconv` stays free of flax/sklearn


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"cconv.{name}")
    raise AttributeError(f"module 'cconv' has no attribute {name!r}")
