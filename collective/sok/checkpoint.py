"""``tf.train.Checkpoint`` and ``model.save_weights`` of SOK tables as whole logical tables, N -> M workers.

A SOK table (a v1 layer's ``embedding_variable``, a ``sok.Variable``, a
``sok.DynamicVariable``) is this worker's shard, an ordinary ``tf.Variable``.
:func:`save_logical` gives that variable TensorFlow's trackable hooks
(``_serialize_to_tensors`` / ``_restore_from_tensors``), so a checkpoint holds,
under the variable's own checkpoint key, two tensors instead of the shard:

- ``VARIABLE_VALUE``: ``[keys, dim]``, the logical table's rows in ascending key order;
- ``keys``: ``[keys]`` int64, those keys (``0 .. rows-1`` for a table without a hash table).

Saving gathers every worker's rows on worker 0 (one alltoall per tensor,
:func:`collective.checkpoint.logical.gather_on_rank0`): **a save is a collective, every
worker calls it**, as ``sok.dump`` and TensorFlow's own multi-worker Keras
saving. Worker 0's file is the checkpoint; the other workers write theirs
(empty tables) to a path of their own, :func:`checkpoint_path`. Restoring
needs no collective: every worker reads the checkpoint and keeps the keys it
owns under its own world size, so a checkpoint written on N workers restores
on M. A hash table's index is rebuilt from the keys (the index variables save
nothing, :func:`not_saved`).

An optimizer slot of a SOK table (Adam's moments, momentum, Adagrad's
accumulator) is saved the same way, under the slot's own key, with the
table's keys: :mod:`collective.sok.slots` gives slots these hooks.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from typing import Callable, Dict, Optional

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import logical
from collective.embedding.table import ShardInfo, shard_of
from collective.tf_internals import saveable_object_util

logger = logging.getLogger("collective.sok")

VALUES = "VARIABLE_VALUE"  # TensorFlow's name for a variable's value: plain TF reads the logical table under it
KEYS = "keys"
_scratch: Dict[str, str] = {}


def save_logical(var: tf.Variable, info: Optional[ShardInfo] = None, where: Optional[str] = None,
                 write: Optional[Callable] = None) -> tf.Variable:
    """Makes checkpoints save ``var`` (a tagged SOK shard) as its logical table and restore it under any world size.

    Call it before anything tracks ``var`` (a checkpoint restored before the
    variable exists restores into it as soon as it is tracked). For an
    optimizer slot (:mod:`collective.sok.slots`), ``info`` is its table's
    layout, ``where`` names it in errors and ``write(var, info, keys, values)``
    writes the restored rows this worker owns instead of :func:`restore_table`.
    """
    table = (lambda: info) if info is not None else (lambda: shard_of(var))
    # Set on this one variable, not patched into TensorFlow: only SOK shards save as logical tables, through the
    # hooks every trackable checkpoint calls (this module's refuse_save and not_saved do the same).
    var._serialize_to_tensors = lambda: _serialize(var, table())  # pylint: disable=protected-access
    var._restore_from_tensors = lambda restored: _restore(  # pylint: disable=protected-access
        var, table(), restored, write or restore_table, where)
    return var


def refuse_save(var: tf.Variable, message: str) -> tf.Variable:
    """Makes a save of a checkpoint holding ``var`` fail with ``ValueError(message)`` (a restore is untouched)."""
    def fail():
        raise ValueError(message)

    spec = saveable_object_util.saveable_object.SaveSpec(fail, "", VALUES, dtype=var.dtype.base_dtype,
                                                         device=var.device or "/cpu:0")
    var._serialize_to_tensors = lambda: {VALUES: spec}  # pylint: disable=protected-access
    return var


def not_saved(var: tf.Variable) -> tf.Variable:
    """Makes checkpoints skip ``var`` (per-worker state rebuilt on restore: a hash table's index)."""
    var._serialize_to_tensors = dict  # pylint: disable=protected-access
    var._restore_from_tensors = lambda restored: None  # pylint: disable=protected-access
    return var


def checkpoint_path(path: str) -> str:
    """The path this worker saves to: ``path`` on worker 0, a temporary one of its own on the others.

    Every worker must take part in a save (:mod:`collective.sok.checkpoint`);
    only worker 0's file is the checkpoint. The others' temporary folder is
    removed when the process exits::

        ckpt.write(sok.checkpoint_path(prefix))          # every worker
        model.save_weights(sok.checkpoint_path(prefix))  # every worker
        ckpt.read(prefix)                                # every worker, any number of them
    """
    if comm.rank() == 0:
        return path
    if "dir" not in _scratch:
        _scratch["dir"] = tempfile.mkdtemp(prefix=f"collective-sok-rank{comm.rank()}-")
        atexit.register(shutil.rmtree, _scratch["dir"], ignore_errors=True)
    return os.path.join(_scratch["dir"], os.path.basename(os.path.normpath(str(path))) or "ckpt")


def _serialize(var: tf.Variable, info: ShardInfo) -> dict:
    """The logical table as two lazy tensors: gathered when the save writes them, never on a restore.

    A restore also calls this (for names and dtypes only), so the gather
    hides behind ``SaveSpec`` callables that only a save evaluates.
    """
    gathered = {}

    def gather():
        if not gathered:
            logger.debug("sok checkpoint: gathering %s on worker 0 (every worker must call save)", info.name)
            with comm.uncounted():
                gathered[KEYS], (gathered[VALUES],) = logical.gather_on_rank0(info, [var])
        return gathered

    save_spec = saveable_object_util.saveable_object.SaveSpec
    device = var.device or "/cpu:0"
    return {VALUES: save_spec(lambda: gather()[VALUES], "", VALUES, dtype=var.dtype.base_dtype, device=device),
            KEYS: save_spec(lambda: gather()[KEYS], "", KEYS, dtype=tf.int64, device=device)}


def _restore(var: tf.Variable, info: ShardInfo, restored: dict, write: Callable, where: Optional[str]):
    """Passes the restored keys this worker owns (under its own world size) and their rows to ``write``."""
    keys, values = tf.reshape(restored[KEYS], [-1]), restored[VALUES]
    checks = _checks(info, keys, values, where or f"SOK table {info.name}")
    with tf.control_dependencies(checks):
        keys, (values,) = logical.keep_owned(info.layout, keys, [values])
    return write(var, info, keys, values)


def restore_table(var: tf.Variable, info: ShardInfo, keys: tf.Tensor, values: tf.Tensor):
    """Writes a table's restored rows; a hash table's index then holds exactly ``keys``, at rows ``0 ..``.

    Slot rows whose write waits for this index (:func:`restore_hash_slot`) follow it.
    """
    done = logical.assign_owned([var], info, keys, [values])
    index = info.hash_index
    if index is None:
        return done
    pending, index._sok_pending = getattr(index, "_sok_pending", []), []  # pylint: disable=protected-access
    if tf.executing_eagerly():
        index._sok_restored = (None, keys.numpy())  # pylint: disable=protected-access
        for slot, slot_keys, values_, initial, graph in pending:
            if graph is None and np.array_equal(slot_keys.numpy(), keys.numpy()):
                logical.assign_slot_rows(slot, index, slot_keys, values_, initial)
            else:
                logger.warning("sok checkpoint: %s restored other keys than its optimizer slot %s; the slot keeps "
                               "its values", info.name, slot.name)
        return done
    graph = tf.compat.v1.get_default_graph()
    done = tf.group(done)
    index._sok_restored = (graph, done)  # pylint: disable=protected-access
    writes = [logical.assign_slot_rows(slot, index, k, v, initial, done)
              for slot, k, v, initial, g in pending if g is graph]
    return tf.group(done, *writes)


def restore_hash_slot(slot: tf.Variable, info: ShardInfo, keys: tf.Tensor, values: tf.Tensor,
                      initial: Optional[tf.Tensor], where: str):
    """Writes an optimizer slot's restored rows at the rows its hash table's index gives the keys.

    The table's own restore rebuilds the index (:func:`restore_table`: the
    owned keys in ascending order at rows ``0 ..``, whatever held them before),
    and a checkpoint restores table and slots in no fixed order. So the slot
    writes now when the index was last rebuilt from these very keys (eagerly:
    the same keys; in a graph: after that rebuild's op), else its write waits
    for the table's restore. Every row the checkpoint does not give goes back
    to the slot's initial value (a key inserted later starts its slots afresh).
    """
    if initial is None:
        raise ValueError(f"{where}: the value its rows start with is not known (the slot existed before "
                         "collective.sok saw its optimizer, or its rows start unequal), so the rows the checkpoint "
                         "lacks cannot be reset; wrap the optimizer in sok.OptimizerWrapper before its first step, "
                         "or restore with sok.load(path, variables, optimizer)")
    index = info.hash_index
    marker = getattr(index, "_sok_restored", None)
    if tf.executing_eagerly():
        if marker is not None and marker[0] is None and np.array_equal(marker[1], keys.numpy()):
            return logical.assign_slot_rows(slot, index, keys, values, initial)
        graph = None
    else:
        graph = tf.compat.v1.get_default_graph()
        if marker is not None and marker[0] is graph:
            return logical.assign_slot_rows(slot, index, keys, values, initial, marker[1])
    pending = [p for p in getattr(index, "_sok_pending", []) if p[0] is not slot]
    index._sok_pending = pending + [(slot, keys, values, initial, graph)]  # pylint: disable=protected-access
    return None if graph is None else tf.no_op()


def _checks(info: ShardInfo, keys: tf.Tensor, values: tf.Tensor, where: str) -> list:
    """The restored table's width and, without a hash table, its keys' range: errors eagerly, assertions in graphs."""
    width = values.shape[-1] if values.shape.rank == 2 else None
    if width is not None and width != info.dim:
        raise ValueError(f"{where}: the checkpoint's table has {width} columns, this table {info.dim}; restore "
                         "it into a table of the same dimension")
    if info.hash_index is not None:
        return []
    too_far = f"{where}: the checkpoint holds rows at or beyond this table's {info.vocab} rows " \
              f"(max_vocabulary_size_per_gpu * {info.world_size} workers for a SOK layer); raise " \
              "max_vocabulary_size_per_gpu (or the rows of the sok.Variable) so that the table holds the saved one"
    if tf.executing_eagerly():
        if int(tf.size(keys)) and int(tf.reduce_max(keys)) >= info.vocab:
            raise ValueError(too_far)
        return []
    return [tf.debugging.assert_less(keys, tf.constant(info.vocab, tf.int64), message=too_far)]
