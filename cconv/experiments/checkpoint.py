"""Checkpoints of arbitrary pytrees (trainer state, PRNG keys, sharded arrays) with orbax.

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a kill
during a save leaves the previous checkpoint intact (and the temporary one is cleaned up on the
next start).  The state is stored as its flat list of leaves and rebuilt with the tree structure of
a *template* (a freshly initialised state of the same run), which keeps any pytree node type
(NamedTuples, optax states, empty nodes) and places each restored array with the template leaf's
sharding.  Typed PRNG keys are stored as their key data.  Small host-side state (step counters,
the data iterator's position) travels as JSON next to the arrays, in the same atomic checkpoint.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from typing import Any

import jax
import numpy as np

from cconv.experiments import io
from cconv.experiments.io import _jsonable


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _leaf_out(x, host: bool = False):
    """A leaf as orbax writes it; ``host``: as a NumPy array (one process among several: orbax
    writes no array of a single process's device, ``Checkpointer``)."""
    if _is_key(x):
        x = jax.random.key_data(x)
    if isinstance(x, jax.Array):
        return np.asarray(jax.device_get(x)) if host else x
    return x if isinstance(x, np.ndarray) else np.asarray(x)


def _abstract(x, host: bool = False):
    if _is_key(x):
        x = jax.random.key_data(x)
    if isinstance(x, jax.Array) and host:
        return np.zeros(x.shape, x.dtype)  # read back as NumPy, placed on the template's device after
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    a = np.asarray(x)
    return jax.ShapeDtypeStruct(a.shape, a.dtype)


def _leaf_in(restored, template):
    if not isinstance(restored, jax.Array) and isinstance(template, jax.Array):  # read back as NumPy (host)
        restored = jax.device_put(restored, template.sharding if not _is_key(template) else None)
    if _is_key(template):
        return jax.random.wrap_key_data(restored, impl=jax.random.key_impl(template))
    if isinstance(template, jax.Array):
        return restored
    if isinstance(template, np.ndarray):
        return np.asarray(restored)
    return type(template)(np.asarray(restored).item())


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored (damaged or truncated files)."""


def write_error_reason(e: BaseException) -> str:
    """A short reason for a failed write: the OS error's description when there is one (orbax and
    tensorstore wrap ENOSPC in long messages), else the first line of the message."""
    for err in (e, e.__cause__, e.__context__):
        if isinstance(err, OSError) and err.strerror:
            return err.strerror.lower()
    text = str(e)
    code = re.search(r"os_error_code='?(\d+)", text)
    if code and int(code.group(1)) in errno.errorcode:
        return os.strerror(int(code.group(1))).lower()
    first = text.splitlines()[0] if text else type(e).__name__
    return first if len(first) <= 200 else first[:197] + "..."


def _manager_options(host: bool) -> dict:
    """orbax's options: a run's checkpoints, or with ``host`` (one process's run among several,
    ``jax.distributed``) this process's alone, with no barrier that waits for the others."""
    import orbax.checkpoint as ocp

    if not host:
        return {"create": True}
    me = jax.process_index()  # the directory exists (``io.ensure_dir``): orbax's create is for all processes
    mp = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    return {"create": False, "multiprocessing_options": mp}


class Checkpointer:
    """``save(step, state, meta)`` / ``restore(template) -> (step, state, meta)`` over orbax.

    Keeps the ``keep`` most recent checkpoints under ``directory``.  ``local``: the run is this
    process's alone even where ``jax.distributed`` joins several (the runner: ``RunDir``; the
    advisor races in process 0 of a measured run across processes): its arrays are written from
    the host as NumPy and no other process takes part.  Otherwise every process saves its shards of
    the global arrays together, as orbax does.
    """

    def __init__(self, directory: str, keep: int = 1, local: bool = False):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = io.ensure_dir(os.path.abspath(directory))  # a real directory, never a link
        self._host = local and jax.process_count() > 1  # one process's run among several: NumPy leaves
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,
            **_manager_options(self._host),
        )
        self._mngr = ocp.CheckpointManager(self.directory, options=opts)

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints on disk, oldest first."""
        return sorted(self._mngr.all_steps())

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(int(step)))

    def set_aside(self, step: int) -> str:
        """Move the checkpoint of ``step`` out of the way (to ``<directory>.damaged/<step>``, kept
        for inspection), so that an earlier one becomes the latest; returns its new path."""
        dest_dir = io.ensure_dir(self.directory + ".damaged")
        dest = os.path.join(dest_dir, str(int(step)))
        n = 1
        while os.path.exists(dest):
            dest, n = os.path.join(dest_dir, f"{int(step)}.{n}"), n + 1
        os.replace(self.path(step), dest)
        self._mngr.reload()
        return dest

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Write the checkpoint of ``step`` atomically.  A failed write (e.g. a full disk) removes
        its partial temporary directory (the previous checkpoint stays the latest) and raises a
        one-line ``CheckpointError`` naming the checkpoint and the reason."""
        ocp = self._ocp
        leaves = {str(i): _leaf_out(x, self._host) for i, x in enumerate(jax.tree.leaves(state))}
        try:
            self._mngr.save(
                int(step),
                args=ocp.args.Composite(state=ocp.args.StandardSave(leaves), meta=ocp.args.JsonSave(_jsonable(meta))),
                force=True,
            )
            self._mngr.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - orbax raises many types; the reason is kept as the cause
            self._discard_partial(step)
            raise CheckpointError(f"cannot write checkpoint {self.path(step)}: {write_error_reason(e)}") from e

    def _discard_partial(self, step: int, quiet: float = 2.0, deadline: float = 60.0) -> None:
        """Remove the temporary directories of an unfinished save of ``step`` (frees the space).

        A failed save returns while tensorstore's C++ writers still hold writes of the other arrays
        (and the OCDBT manifest) in flight; they recreate the directories they write into. So the
        directories are removed until none has reappeared for ``quiet`` seconds (at most
        ``deadline`` seconds): the in-flight writes are finite, and each ends in a removal."""
        prefix = f"{int(step)}.orbax-checkpoint-tmp"

        def partial() -> list[str]:
            names = os.listdir(self.directory) if os.path.isdir(self.directory) else ()
            return [os.path.join(self.directory, n) for n in names if n.startswith(prefix)]

        now = time.monotonic()
        end, calm = now + deadline, now + quiet  # calm: when no directory has reappeared for quiet s
        while now < end:
            found = partial()
            for path in found:
                shutil.rmtree(path, ignore_errors=True)
            now = time.monotonic()
            if found:
                calm = now + quiet
            elif now >= calm:
                return
            time.sleep(0.05)

    def restore(self, template: Any, step: int | None = None) -> tuple[int, Any, dict]:
        """Restore the latest (or the given) step into the structure and shardings of template."""
        ocp = self._ocp
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        t_leaves, treedef = jax.tree.flatten(template)
        abstract = {str(i): _abstract(x, self._host) for i, x in enumerate(t_leaves)}
        out = self._mngr.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        leaves = [_leaf_in(out["state"][str(i)], t) for i, t in enumerate(t_leaves)]
        return int(step), jax.tree.unflatten(treedef, leaves), dict(out["meta"])

    def close(self) -> None:
        self._mngr.close()


def encode_host_state(obj: Any) -> Any:
    """JSON-encodable form of a host-side state dict (e.g. a data iterator's ``state_dict()``):
    numpy arrays become ``{"__ndarray__": list, "dtype": str}``."""
    if isinstance(obj, dict):
        return {str(k): encode_host_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_host_state(v) for v in obj]
    if _is_key(obj):
        obj = jax.random.key_data(obj)
    if isinstance(obj, (np.ndarray, jax.Array)):
        a = np.asarray(obj)
        return {"__ndarray__": a.tolist(), "dtype": str(a.dtype), "shape": list(a.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def decode_host_state(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"]).reshape(obj["shape"])
        return {k: decode_host_state(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_host_state(v) for v in obj]
    return obj
