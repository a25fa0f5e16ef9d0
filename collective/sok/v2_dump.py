"""SOK v2's ``sok.dump`` and ``sok.load``: whole logical tables with their optimizer slots, N -> M.

Files use ``sok.Saver``'s format (:mod:`collective.sok.dump_format`): for a
variable named ``NAME`` (``/`` as ``_``), ``NAME_keys.file`` and
``NAME_values.file``, and per optimizer slot ``S`` ``NAME-S_keys.file`` /
``NAME-S_values.file`` (the same keys, the slot's rows). Worker 0 writes;
every worker reads the keys it owns under its own world size, so a dump
from N workers loads on M. Eagerly and in ``tf.function`` they act at once;
in TF1 graphs they return an op.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import tensorflow as tf

from collective.embedding.table import shard_of
from collective.sok.dump_format import dump_tables, load_tables
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


def load(path: str, sok_vars: Sequence, optimizer=None):
    """Reads each SOK variable's rows (and optimizer slots) that this worker owns from a dump in ``path``.

    The dump may come from any number of workers. With ``optimizer``, its
    slots for the variables must exist (run one step first, or
    ``optimizer.build(variables)`` for a Keras optimizer); a missing slot file fails naming it.
    """
    ops = []
    for var in _check(sok_vars, "sok.load"):
        slots = _slots(var, optimizer)
        if optimizer is not None and not slots and _needs_slots(optimizer):
            raise ValueError(f"sok.load: the optimizer has no slots for '{var.name}' yet; build them first "
                             "(optimizer.build(variables) for a Keras optimizer)")
        ops.append(load_tables(path, _file_names(var, slots), shard_of(var), [var, *slots.values()]))
    return None if tf.executing_eagerly() else tf.group(ops)


def _needs_slots(optimizer) -> bool:
    opt = optimizer.optimizer if isinstance(optimizer, OptimizerWrapper) else optimizer
    return not isinstance(opt, (tf.keras.optimizers.SGD, tf.compat.v1.train.GradientDescentOptimizer)) or \
        bool(getattr(opt, "momentum", 0))
