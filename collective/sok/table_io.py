"""A SOK table as one logical table: its rows gathered on worker 0, its dump files, the rows a worker owns.

Shared by :mod:`collective.sok.saver` (``sok.Saver``), :mod:`collective.sok.v2_dump`
(``sok.dump``/``sok.load``) and :mod:`collective.sok.checkpoint` (``tf.train.Checkpoint``
and ``model.save_weights``):

- :func:`held_keys` / :func:`held_values`: the keys this worker holds and their rows;
- :func:`to_rank0`: every worker's rows on worker 0 (one alltoall, a collective);
- :func:`write_dump` / :func:`read_owned`: SOK v1's raw ``NAME_keys.file`` / ``NAME_values.file``;
- :func:`assign_owned`: writes the keys this worker owns into its shard (a hash table is emptied first);
- :func:`numpy_call` / :func:`text`: numpy code eagerly or as a graph op, bytes as text.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from collective import comm, heartbeat
from collective.checkpoint.hash_tables import insert_rows
from collective.embedding.table import ShardInfo

logger = logging.getLogger("collective.sok")

KEYS_SUFFIX = "_keys.file"
VALUES_SUFFIX = "_values.file"
_KEY_DTYPE = np.dtype("<i8")
_SOK_UINT32_KEYS = np.dtype("<u4")  # SOK v1 tables with key_dtype uint32 dump 4-byte keys


def dump_files(directory: str, name: str) -> Tuple[str, str]:
    """The keys and values files of the table ``name`` (an ``m_var_name``) in ``directory``."""
    return os.path.join(directory, name + KEYS_SUFFIX), os.path.join(directory, name + VALUES_SUFFIX)


def text(value) -> str:
    """``value`` (bytes from a tensor, or a str) as a str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def numpy_call(fn, inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType]):
    """``fn`` on numpy values: called directly eagerly (its exceptions propagate), else ``tf.numpy_function``."""
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(v, d) for v, d in zip(fn(*[t.numpy() for t in inputs]), dtypes)]
    return tf.numpy_function(fn, list(inputs), list(dtypes), stateful=True)


def held_keys(info: ShardInfo) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """The logical keys this worker holds and, for a hash table, their local rows (None: local row ``i`` in order)."""
    if info.hash_index is None:
        return info.layout.global_row(tf.range(info.local_rows, dtype=tf.int64)), None
    return info.hash_index.entries()


def held_values(table, rows: Optional[tf.Tensor]) -> tf.Tensor:
    """The rows of ``table`` (the values variable or a slot) that :func:`held_keys` gave, in its order."""
    return tf.convert_to_tensor(table) if rows is None else tf.gather(table, rows)


def to_rank0(tensor: tf.Tensor) -> tf.Tensor:
    """Every worker's rows of ``tensor``, concatenated in rank order, on worker 0 (others get none).

    A collective: every worker calls it, in the same order as the others.
    """
    n = comm.world_size()
    if n == 1:
        return tensor
    count = tf.shape(tensor)[:1]
    return comm.alltoall(tensor, tf.concat([count, tf.zeros([n - 1], tf.int32)], axis=0))[0]


def write_dump(directory: str, name: str, keys: np.ndarray, values: np.ndarray) -> None:
    """Writes the keys (ascending) and their values, each file to a temporary name first, then renamed."""
    os.makedirs(directory, exist_ok=True)
    order = np.argsort(keys, kind="stable")
    values = np.asarray(values)
    with heartbeat.phase("save"):  # the other workers wait for worker 0's files: no stall
        for path, data in zip(dump_files(directory, name), (keys[order].astype(_KEY_DTYPE),
                                                            values[order].astype(values.dtype.newbyteorder("<")))):
            temporary = f"{path}.tmp{os.getpid()}"
            with open(temporary, "wb") as out:
                out.write(np.ascontiguousarray(data).tobytes())
            os.replace(temporary, path)
    logger.info("sok: dumped %d keys of %s into %s", len(keys), name, directory)


def read_owned(directory: str, name: str, info: ShardInfo, value_dtype, rows: Optional[int],
               key_dtype: str) -> Tuple[np.ndarray, np.ndarray]:
    """The dumped keys this worker owns and their vectors, checked against the table; errors name both."""
    keys_path, values_path = dump_files(directory, name)
    where = f"sok.Saver.restore_from_file({name})"
    for path in (keys_path, values_path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{where}: {path} does not exist; was {name} dumped into {directory} "
                                    "(sok.Saver.dump_to_file)?")
    value_dtype = np.dtype(value_dtype).newbyteorder("<")
    key_bytes, value_bytes = os.path.getsize(keys_path), os.path.getsize(values_path)
    row_bytes = value_dtype.itemsize * info.dim
    if value_bytes % row_bytes:
        raise ValueError(f"{where}: {values_path} holds {value_bytes} bytes, not whole rows of "
                         f"embedding_vec_size={info.dim} {value_dtype.name} values; was it dumped from a table "
                         "of another embedding_vec_size or dtype?")
    count = value_bytes // row_bytes
    file_keys = _KEY_DTYPE
    if key_bytes != count * _KEY_DTYPE.itemsize:
        if key_dtype == "int32" and key_bytes == count * _SOK_UINT32_KEYS.itemsize:
            file_keys = _SOK_UINT32_KEYS
        else:
            held = key_bytes / _KEY_DTYPE.itemsize
            raise ValueError(f"{where}: {keys_path} holds {held:g} keys but {values_path} holds {count} rows of "
                             f"embedding_vec_size={info.dim} {value_dtype.name}; "
                             f"it was dumped from a table with {value_bytes / max(held, 1) / value_dtype.itemsize:g}"
                             " values per key (another embedding_vec_size or dtype) or the files are damaged")
    keys = np.fromfile(keys_path, dtype=file_keys).astype(np.int64)
    if np.unique(keys).size != keys.size:
        raise ValueError(f"{where}: {keys_path} repeats keys; it is not a dump of one table")
    if rows is not None and keys.size and (keys.min() < 0 or keys.max() >= rows):
        bad = keys[(keys < 0) | (keys >= rows)][0]
        raise ValueError(f"{where}: {keys_path} holds key {bad}, outside this table's rows [0, {rows}) "
                         f"(max_vocabulary_size_per_gpu * {info.world_size} workers); raise "
                         "max_vocabulary_size_per_gpu so that the logical table holds the dumped one")
    mine = np.flatnonzero(np.mod(keys, info.world_size) == info.rank) if info.layout.sharded else np.arange(keys.size)
    values = np.memmap(values_path, dtype=value_dtype, mode="r", shape=(count, info.dim))
    return keys[mine], np.asarray(values[mine]).astype(value_dtype.newbyteorder("="))


def assign_owned(tables: Sequence[tf.Variable], info: ShardInfo, keys: tf.Tensor,
                 values: Sequence[tf.Tensor]) -> tf.Operation:
    """Writes this worker's ``keys`` (which it owns) with one ``[keys, dim]`` tensor of ``values`` per table.

    ``tables`` is the values variable (and its slots). A table without a hash
    table writes those rows and keeps the others; a hash table's index is
    emptied and then holds exactly ``keys``. Eagerly it has run on return.
    """
    keys = tf.reshape(keys, [-1])
    values = [tf.reshape(v, [-1, info.dim]) for v in values]
    index = info.hash_index
    if index is None:
        local = info.layout.local_row(keys)
        return tf.group(*[t.scatter_update(tf.IndexedSlices(v, local)) for t, v in zip(tables, values)])
    if tf.executing_eagerly():
        index.clear()
        return insert_rows(index, list(tables), keys, values)
    with tf.control_dependencies([index.clear()]):
        return insert_rows(index, list(tables), keys, values)
