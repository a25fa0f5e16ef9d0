"""``tf.train.Checkpoint`` and ``model.save_weights`` of SOK tables as whole logical tables, N -> M workers.

A SOK table (a v1 layer's ``embedding_variable``, a ``sok.Variable``, a
``sok.DynamicVariable``) is this worker's shard, an ordinary ``tf.Variable``.
:func:`save_logical` gives that variable TensorFlow's trackable hooks
(``_serialize_to_tensors`` / ``_restore_from_tensors``), so a checkpoint holds,
under the variable's own checkpoint key, two tensors instead of the shard:

- ``VARIABLE_VALUE``: ``[keys, dim]``, the logical table's rows in ascending key order;
- ``keys``: ``[keys]`` int64, those keys (``0 .. rows-1`` for a table without a hash table).

Saving gathers every worker's rows on worker 0 (one alltoall per table,
:func:`collective.sok.table_io.to_rank0`): **a save is a collective, every
worker calls it**, as ``sok.dump`` and TensorFlow's own multi-worker Keras
saving. Worker 0's file is the checkpoint; the other workers write theirs
(empty tables) to a path of their own, :func:`checkpoint_path`. Restoring
needs no collective: every worker reads the checkpoint and keeps the keys it
owns under its own world size, so a checkpoint written on N workers restores
on M. A hash table's index is rebuilt from the keys (the index variables save
nothing, :func:`not_saved`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from typing import Dict

import tensorflow as tf

from collective import comm
from collective.embedding.table import ShardInfo, shard_of
from collective.sok.table_io import assign_owned, held_keys, held_values, to_rank0
from collective.tf_internals import saveable_object_util

logger = logging.getLogger("collective.sok")

VALUES = "VARIABLE_VALUE"  # TensorFlow's name for a variable's value: plain TF reads the logical table under it
KEYS = "keys"
_scratch: Dict[str, str] = {}


def save_logical(var: tf.Variable) -> tf.Variable:
    """Makes checkpoints save ``var`` (a tagged SOK shard) as its logical table and restore it under any world size.

    Call it before anything tracks ``var`` (a checkpoint restored before the
    variable exists restores into it as soon as it is tracked).
    """
    var._serialize_to_tensors = lambda: _serialize(var)  # pylint: disable=protected-access
    var._restore_from_tensors = lambda restored: _restore(var, restored)  # pylint: disable=protected-access
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


def _serialize(var: tf.Variable) -> dict:
    """The logical table as two lazy tensors: gathered when the save writes them, never on a restore.

    A restore also calls this (for names and dtypes only), so the gather
    hides behind ``SaveSpec`` callables that only a save evaluates.
    """
    info = shard_of(var)
    gathered = {}

    def gather():
        if not gathered:
            logger.debug("sok checkpoint: gathering %s on worker 0 (every worker must call save)", info.name)
            with comm.uncounted():
                keys, rows = held_keys(info)
                keys, values = to_rank0(keys), to_rank0(held_values(var, rows))
            order = tf.argsort(keys)
            gathered[KEYS], gathered[VALUES] = tf.gather(keys, order), tf.gather(values, order)
        return gathered

    save_spec = saveable_object_util.saveable_object.SaveSpec
    device = var.device or "/cpu:0"
    return {VALUES: save_spec(lambda: gather()[VALUES], "", VALUES, dtype=var.dtype.base_dtype, device=device),
            KEYS: save_spec(lambda: gather()[KEYS], "", KEYS, dtype=tf.int64, device=device)}


def _restore(var: tf.Variable, restored: dict):
    """Writes the restored keys this worker owns (under its own world size) into its shard."""
    info = shard_of(var)
    keys, values = tf.reshape(restored[KEYS], [-1]), restored[VALUES]
    checks = _checks(info, keys, values)
    with tf.control_dependencies(checks):
        mine = info.layout.owns(keys)
        keys, values = tf.boolean_mask(keys, mine), tf.boolean_mask(values, mine)
    return assign_owned([var], info, keys, [values])


def _checks(info: ShardInfo, keys: tf.Tensor, values: tf.Tensor) -> list:
    """The restored table's width and, without a hash table, its keys' range: errors eagerly, assertions in graphs."""
    where = f"SOK table {info.name}"
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
