"""SOK v2's ``sok.dump`` and ``sok.load``: whole logical tables with their optimizer slots, N -> M.

Files use :mod:`collective.sok.saver`'s format (:mod:`collective.sok.table_io`):
for a variable named ``NAME`` (``/`` as ``_``), ``NAME_keys.file`` and ``NAME_values.file``, and per
optimizer slot ``S`` ``NAME-S_keys.file`` / ``NAME-S_values.file`` (the same
keys, the slot's rows). Worker 0 writes; every worker reads the keys it owns
under its own world size, so a dump from N workers loads on M.
Eagerly and in ``tf.function`` they act at once; in TF1 graphs they return an op.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from collective import comm
from collective.embedding.table import ShardInfo, shard_of
from collective.sok.table_io import (assign_owned, held_keys, held_values, numpy_call, read_owned, text, to_rank0,
                                     write_dump)
from collective.sok.v2_optimizer import OptimizerWrapper


def _file_name(var) -> str:
    return shard_of(var).name.replace("/", "_")


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
        keys, rows = held_keys(shard_of(var))
        tables = {"": var, **{f"-{s}": slot for s, slot in _slots(var, optimizer).items()}}
        keys0 = to_rank0(keys)
        for suffix, table in tables.items():
            name = _file_name(var) + suffix

            def write(directory, k, v, name=name):
                if comm.rank() == 0:
                    write_dump(text(directory), name, k, v)
                return (np.int64(0),)

            values0 = to_rank0(held_values(table, rows))
            ops.append(numpy_call(write, [tf.convert_to_tensor(path, tf.string), keys0, values0], [tf.int64])[0])
    done = comm.allreduce(tf.reshape(tf.add_n(ops), [1]), "sum") if comm.world_size() > 1 else tf.add_n(ops)
    return None if tf.executing_eagerly() else tf.group(done)


def _load_one(path, var, info: ShardInfo, slots: Dict[str, tf.Variable]):
    names = [_file_name(var)] + [f"{_file_name(var)}-{s}" for s in slots]
    tables = [var] + list(slots.values())
    rows = None if info.hash_index is not None else info.vocab
    dtype = var.dtype.base_dtype
    key_dtype = tf.as_dtype(getattr(var, "m_key_dtype", tf.int64)).name

    def read(directory):
        parts = [read_owned(text(directory), n, info, dtype.as_numpy_dtype, rows, key_dtype) for n in names]
        return [parts[0][0]] + [p[1] for p in parts]

    out = numpy_call(read, [tf.convert_to_tensor(path, tf.string)], [tf.int64] + [dtype] * len(tables))
    return assign_owned(tables, info, out[0], out[1:])


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
        ops.append(_load_one(path, var, shard_of(var), slots))
    return None if tf.executing_eagerly() else tf.group(ops)


def _needs_slots(optimizer) -> bool:
    opt = optimizer.optimizer if isinstance(optimizer, OptimizerWrapper) else optimizer
    return not isinstance(opt, (tf.keras.optimizers.SGD, tf.compat.v1.train.GradientDescentOptimizer)) or \
        bool(getattr(opt, "momentum", 0))
