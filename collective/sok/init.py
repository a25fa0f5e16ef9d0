"""``sok.Init`` and the check that refuses ``tf.distribute`` strategies."""

from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from collective import comm

logger = logging.getLogger("collective.sok")

_global_batch_size: Optional[int] = None


class UnsupportedStrategyError(RuntimeError):
    """SOK code ran under a ``tf.distribute`` strategy, which collective does not support."""


def refuse_tf_distribute(where: str) -> None:
    """Raises :class:`UnsupportedStrategyError` when a ``tf.distribute`` strategy is active."""
    if not tf.distribute.has_strategy():
        return
    name = type(tf.distribute.get_strategy()).__name__
    raise UnsupportedStrategyError(
        f"{where} was called under {name}: collective.sok does not support tf.distribute strategies "
        "(MirroredStrategy, MultiWorkerMirroredStrategy, ...). Use Horovod instead: drop the strategy and its "
        "scope()/run()/reduce(), allreduce dense gradients with hvd.allreduce, and start one process per "
        "device with 'python -m collective.launch -n N script.py' (see docs/api_sok.md).")


def Init(global_batch_size: Optional[int] = None, **kwargs):  # noqa: N802
    """Initialises SOK: Horovod (when there are several workers) and the global batch size.

    Args:
      global_batch_size: examples per step over all workers; must divide by
        the number of workers.

    Returns:
      In a graph, an op to run first (``sess.run(sok.Init(...))``); eagerly, None.
    """
    global _global_batch_size
    refuse_tf_distribute("sok.Init")
    if kwargs:
        raise TypeError(f"sok.Init got unsupported argument(s) {', '.join(sorted(kwargs))}; "
                        "the supported argument is global_batch_size")
    comm.init()
    if global_batch_size is not None:
        n = comm.world_size()
        if not isinstance(global_batch_size, int) or global_batch_size < 1 or global_batch_size % n:
            raise ValueError(f"sok.Init: global_batch_size={global_batch_size!r} must be a positive integer "
                             f"divisible by the {n} workers")
        _global_batch_size = global_batch_size
    if tf.executing_eagerly():
        return None
    return tf.no_op(name="sok_init")


def global_batch_size() -> Optional[int]:
    """The value given to :func:`Init`, or None."""
    return _global_batch_size
