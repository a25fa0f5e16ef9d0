"""SOK v2's ``sok.dump``, ``sok.load`` and SOK 2.1's ``sok.incremental_dump``: logical tables with slots, N -> M.

Files use ``sok.Saver``'s format (:mod:`collective.sok.dump_format`): for a
variable named ``NAME`` (``/`` as ``_``), ``NAME_keys.file`` and
``NAME_values.file``, and per optimizer slot ``S`` ``NAME-S_keys.file`` /
``NAME-S_values.file`` (the same keys, the slot's rows). Worker 0 writes;
every worker reads the keys it owns under its own world size, so a dump
from N workers loads on M. Eagerly and in ``tf.function`` they act at once;
in TF1 graphs they return an op.

``sok.incremental_dump(path, time, sok_vars, optimizer=None)`` writes, in
the same files, only the rows (keys) that an optimizer updated at or after
``time``; each SOK table keeps every local row's last update time
(:func:`collective.checkpoint.touched.updated_since`). Its directory also
holds ``incremental_dump.json``, so ``sok.load`` of it updates or inserts
the dumped keys and keeps every other row: ``sok.load`` of a full dump and
then of each later incremental dump, in order, gives the tables and slots of
the last dump's moment, on any number of workers.
"""

from __future__ import annotations

import datetime
import json
import numbers
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import touched
from collective.embedding.hash_table import growth
from collective.embedding.table import shard_of
from collective.sok import slots as sok_slots
from collective.sok.dump_format import dump_selected_rows, dump_tables, incremental_flag, load_tables
from collective.sok.v2_optimizer import OptimizerWrapper


def _file_names(var, slots: Dict[str, tf.Variable]) -> List[str]:
    """The dump names of ``var`` and of each of its ``slots``."""
    name = shard_of(var).name.replace("/", "_")
    return [name] + [f"{name}-{slot}" for slot in slots]


def _slots(var, optimizer) -> Dict[str, tf.Variable]:
    if optimizer is None:
        return {}
    wrapper = optimizer if isinstance(optimizer, OptimizerWrapper) else OptimizerWrapper(optimizer)
    return wrapper.slots(var)


def _check(variables, where: str) -> list:
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    for var in variables:
        if shard_of(var) is None:
            raise TypeError(f"{where}: '{getattr(var, 'name', var)}' is not a sok.Variable or sok.DynamicVariable")
    return variables


def dump(path: str, sok_vars: Sequence, optimizer=None):
    """Writes each SOK variable's whole logical table (and its optimizer slots) into directory ``path``.

    Every worker calls it with the same variables in the same order.
    """
    ops = []
    for var in _check(sok_vars, "sok.dump"):
        slots = _slots(var, optimizer)
        ops.append(dump_tables("sok.dump", path, _file_names(var, slots), shard_of(var), [var, *slots.values()]))
    return None if tf.executing_eagerly() else tf.group(ops)


def incremental_dump(path: str, time: Union[datetime.datetime, float, int, tf.Tensor], sok_vars: Sequence,
                     optimizer=None) -> Dict[str, Union[int, tf.Tensor]]:
    """SOK 2.1's ``sok.incremental_dump``: the keys updated at or after ``time``, with their rows and slots.

    Writes ``sok.dump``'s files into directory ``path`` (use a new one per
    dump), holding for each SOK variable only the keys whose row an
    optimizer (``sok.OptimizerWrapper``, or any optimizer inside
    ``CollectiveStrategy.scope()``) updated at or after ``time``, new keys of a
    ``sok.DynamicVariable`` included, plus ``incremental_dump.json``. An
    optimizer that moves every row at each step (Adam; dense gradients)
    makes every key count as updated. ``sok.load`` of it updates or inserts
    those keys and leaves every other row as it was. Every worker calls it
    with the same arguments (a collective).

    Args:
      path: the dump directory (made if missing).
      time: a ``datetime.datetime`` (a naive one is local time, as
        ``datetime.timestamp()`` takes it) or UNIX seconds (a number, or a
        float64 scalar tensor in a graph); typically the moment of the previous dump.
      sok_vars: SOK variables (``sok.Variable``, ``sok.DynamicVariable``).
      optimizer: the ``sok.OptimizerWrapper`` (or its optimizer) whose slots to dump with the rows.

    Returns:
      ``{variable name: keys dumped}``: ints eagerly; in a TF1 graph int64
      tensors, whose evaluation writes the dump.
    """
    seconds = _seconds(time)
    description = json.dumps({"format": "collective-sok-incremental/1", "world_size": comm.world_size(),
                              "updated_since": seconds if isinstance(seconds, float) else None})
    counts = {}
    for var in _check(sok_vars, "sok.incremental_dump"):
        slots = _slots(var, optimizer)
        names = _file_names(var, slots)
        counts[shard_of(var).name] = dump_selected_rows("sok.incremental_dump", path, names, shard_of(var),
                                                        [var, *slots.values()], touched.updated_since(var, seconds),
                                                        description)
    if tf.executing_eagerly():
        return {name: int(count) for name, count in counts.items()}
    return counts


def _seconds(time) -> Union[float, tf.Tensor]:
    """``time`` as UNIX seconds (float), or a float64 tensor for a tensor."""
    if isinstance(time, datetime.datetime):
        return time.timestamp()
    if isinstance(time, numbers.Real) and not isinstance(time, bool):
        return float(time)
    if isinstance(time, (tf.Tensor, tf.Variable)):
        return tf.cast(time, tf.float64)
    raise TypeError(f"sok.incremental_dump: time must be a datetime.datetime or UNIX seconds (a number), got "
                    f"{time!r}; e.g. pass time.time() taken when the previous dump was written")


def load(path: str, sok_vars: Sequence, optimizer=None):
    """Reads each SOK variable's rows (and optimizer slots) that this worker owns from a dump in ``path``.

    The dump may come from any number of workers. A dump of
    :func:`incremental_dump` updates or inserts its keys and keeps every
    other row; a whole dump sets the fixed tables' rows and leaves a
    ``sok.DynamicVariable`` with exactly the dumped keys. With ``optimizer``, its
    slots for the variables must exist (run one step first, or
    ``optimizer.build(variables)`` for a Keras optimizer); a missing slot file fails naming it.
    """
    ops = []
    for var in _check(sok_vars, "sok.load"):
        slots = _slots(var, optimizer)
        if optimizer is not None and not slots and _needs_slots(optimizer):
            raise ValueError(f"sok.load: the optimizer has no slots for '{var.name}' yet; build them first "
                             "(optimizer.build(variables) for a Keras optimizer)")
        ops.append(load_tables(path, _file_names(var, slots), shard_of(var), [var, *slots.values()],
                               update_only=incremental_flag(path), fresh=_fresh_rows(var, slots.values())))
    return None if tf.executing_eagerly() else tf.group(ops)


def _fresh_rows(var, slots) -> List[Tuple[tf.Variable, object]]:
    """``(per-row variable, its initial row)`` of a ``sok.DynamicVariable``: values, slots, a policy's usage and
    the update marks, reset by a whole load (a key inserted later must find no state of a key held before)."""
    index = shard_of(var).hash_index
    if index is None:
        return []
    fresh = [(var, np.zeros([shard_of(var).dim], var.dtype.base_dtype.as_numpy_dtype))]
    for slot in slots:
        row = sok_slots.initial_row(slot)
        if row is None and not tf.executing_eagerly() and not tf.inside_function():
            row = growth.initial_row(slot, index.name)  # a TF1 slot: its initial value says
        if row is None:
            raise ValueError(f"sok.load: the value the rows of optimizer slot '{slot.name}' of '{var.name}' start "
                             "with is not known (the slot existed before collective.sok saw its optimizer), so the "
                             "rows of keys the dump lacks cannot be reset; wrap the optimizer in sok.OptimizerWrapper "
                             "before its first step")
        fresh.append((slot, row))
    dynamic = getattr(index, "dynamic", None)
    if dynamic is not None:
        fresh.append((dynamic.usage, np.zeros([2], np.int64)))
    fresh += [(state, growth.never_marked(state.dtype)) for _, state in touched.row_state(var)]
    return fresh


def _needs_slots(optimizer) -> bool:
    opt = optimizer.optimizer if isinstance(optimizer, OptimizerWrapper) else optimizer
    return not isinstance(opt, (tf.keras.optimizers.SGD, tf.compat.v1.train.GradientDescentOptimizer)) or \
        bool(getattr(opt, "momentum", 0))
