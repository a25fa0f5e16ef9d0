"""``sok.Saver``: SOK v1's dump, restore and load of embedding tables, as whole logical tables.

    saver = sok.Saver()
    saver.load_embedding_values(layer.embedding_variable, table)       # [rows, dim], or a list of parts
    saver.dump_to_file(layer.embedding_variable, "/path/to/dir")       # every worker calls it
    saver.restore_from_file(layer.embedding_variable, "/path/to/dir")  # any number of workers

Files (SOK v1's format): for an embedding variable whose ``m_var_name`` is
``NAME``, a dump holds ``DIR/NAME_keys.file`` (the keys, raw int64,
little-endian, ascending) and ``DIR/NAME_values.file`` (their vectors, raw,
the table's dtype, ``[keys, embedding_vec_size]`` row-major, in key order).
A table without a hash table dumps every row of its logical table, key ``i``
being row ``i``; a hash table dumps the keys it holds. Worker 0 gathers the
table (one alltoall) and writes each file to a temporary name, then renames
it; every worker returns once the files are in place.

``restore_from_file`` needs no collective: each worker reads the keys and
only the rows of the values it owns under its own world size
(``key % world_size == rank``), so a dump written by N workers restores on
M. ``load_embedding_values`` does the same with rows given in memory: row
``i`` of the (concatenated) tensors is key ``i``.

All three work eagerly (they act at once and return the tensor ``b"OK"``),
in ``tf.function``, and in TF1 graphs, where they return a string tensor to
``sess.run`` (after the variables' initializer), as SOK v1's ops.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

from collective.checkpoint import logical
from collective.embedding.table import ShardInfo, shard_of
from collective.sok.dump_format import dump_tables, load_tables

__all__ = ["Saver", "var_name"]


def var_name(embedding_variable: Any) -> str:
    """SOK's ``m_var_name`` of an embedding variable (for other sharded tables their name, '/' as '_')."""
    name = getattr(embedding_variable, "m_var_name", None)
    return name or shard_of(embedding_variable).name.replace("/", "_")


class Saver:
    """SOK v1's ``sok.Saver()``: dumps, restores and loads the embedding variables of SOK layers.

    Every worker calls each method for the same variables in the same order
    (``dump_to_file`` is a collective). Only the tables are saved, not
    optimizer slots (as SOK v1); checkpoints (``tf.train.Checkpoint``,
    ``collective.checkpoint.Saver``) keep those.
    """

    def dump_to_file(self, embedding_variable, filepath) -> tf.Tensor:
        """Writes the whole logical table of ``embedding_variable`` into directory ``filepath`` (made if missing).

        Returns:
          ``b"OK"`` once worker 0 has written both files (a tensor to run in a graph).
        """
        info, _ = _table(embedding_variable, "dump_to_file")
        return dump_tables("sok.Saver.dump_to_file", filepath, [var_name(embedding_variable)], info,
                           [embedding_variable])

    def restore_from_file(self, embedding_variable, filepath) -> tf.Tensor:
        """Loads this worker's rows of the table ``embedding_variable`` from a dump in directory ``filepath``.

        The dump may come from any number of workers. A table without a hash
        table takes the dumped rows (every key must be one of its rows) and
        keeps the others; a hash table is emptied and then holds exactly the
        dumped keys it owns.
        """
        info, _ = _table(embedding_variable, "restore_from_file")
        return _done(load_tables(filepath, [var_name(embedding_variable)], info, [embedding_variable]))

    def load_embedding_values(self, embedding_variable, tensors) -> tf.Tensor:
        """Sets the table of ``embedding_variable`` from ``tensors``: row ``i`` is key ``i``.

        Args:
          embedding_variable: ``layer.embedding_variable`` of a SOK layer.
          tensors: one ``[rows, embedding_vec_size]`` tensor or array (the
            whole logical table, or its first ``rows`` rows), or a list/tuple
            of them, concatenated along axis 0 (SOK v1's form). Every worker
            passes the same values and keeps the rows it owns.
        """
        info, index = _table(embedding_variable, "load_embedding_values")
        name = var_name(embedding_variable)
        dtype = embedding_variable.dtype.base_dtype
        if isinstance(tensors, (list, tuple)):
            if not tensors:
                raise ValueError(f"sok.Saver.load_embedding_values({name}): got an empty list of tensors")
            parts = [_as_tensor(t, dtype, name) for t in tensors]
            values = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
        else:
            values = _as_tensor(tensors, dtype, name)
        _check_static_shape(values, info, index is None, name)
        count = tf.shape(values, out_type=tf.int64)[0]
        checks = [tf.debugging.assert_equal(
            tf.shape(values, out_type=tf.int64)[1], tf.constant(info.dim, tf.int64),
            message=f"sok.Saver.load_embedding_values({name}): tensors must be [rows, {info.dim}]")]
        if index is None:
            checks.append(tf.debugging.assert_less_equal(
                count, tf.constant(info.vocab, tf.int64),
                message=f"sok.Saver.load_embedding_values({name}): more rows than the table's {info.vocab} "
                        "(max_vocabulary_size_per_gpu * workers)"))
        with tf.control_dependencies(checks):
            keys = tf.range(count, dtype=tf.int64)
        keys, (values,) = logical.keep_owned(info.layout, keys, [values])
        return _done(logical.assign_owned([embedding_variable], info, keys, [values]))


# ---------------------------------------------------------------- helpers

def _table(embedding_variable, method: str) -> Tuple[ShardInfo, Optional[Any]]:
    """The variable's shard info and hash index (None for a table without one); refuses other variables."""
    info = shard_of(embedding_variable)
    if info is None or info.replicated or not hasattr(embedding_variable, "scatter_update"):
        raise TypeError(f"sok.Saver.{method}: {getattr(embedding_variable, 'name', embedding_variable)!r} is not "
                        "the embedding variable of a SOK layer; pass layer.embedding_variable")
    index = info.hash_index
    if index is not None and not hasattr(index, "clear"):
        raise TypeError(f"sok.Saver.{method}: {info.name} is an export-mode table (read-only)")
    return info, index


def _as_tensor(value, dtype: tf.DType, name: str) -> tf.Tensor:
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"sok.Saver.load_embedding_values({name}): cannot make a tensor of {type(value).__name__}: "
                        f"{err}") from err
    if not (tensor.dtype.is_floating or tensor.dtype.is_integer):
        raise TypeError(f"sok.Saver.load_embedding_values({name}): values must be numbers, got {tensor.dtype.name}")
    return tf.cast(tensor, dtype)


def _check_static_shape(values: tf.Tensor, info: ShardInfo, fixed_rows: bool, name: str) -> None:
    shape = values.shape
    where = f"sok.Saver.load_embedding_values({name})"
    if shape.rank is not None and shape.rank != 2:
        raise ValueError(f"{where}: tensors must be 2-D [rows, embedding_vec_size={info.dim}], got shape {shape}")
    if shape.rank == 2 and shape[1] is not None and shape[1] != info.dim:
        raise ValueError(f"{where}: tensors have {shape[1]} columns, the table's embedding_vec_size is {info.dim}")
    if fixed_rows and shape.rank == 2 and shape[0] is not None and shape[0] > info.vocab:
        raise ValueError(f"{where}: {shape[0]} rows for a table of {info.vocab} (max_vocabulary_size_per_gpu * "
                         f"{info.world_size} workers)")


def _done(assigned: tf.Operation) -> tf.Tensor:
    """``b"OK"`` once ``assigned`` has run (eagerly it has: a constant)."""
    if tf.executing_eagerly():
        return tf.constant(b"OK")
    with tf.control_dependencies([assigned]):
        return tf.identity(tf.constant(b"OK"))
