"""SOK's dump files: ``NAME_keys.file`` and ``NAME_values.file``, written by worker 0, read by every worker.

A dump holds one logical table (or one optimizer slot of it): the keys, raw
int64 little-endian, ascending, and their rows, raw, the table's dtype,
``[keys, dim]`` row-major, in key order. :func:`dump_tables` gathers the
tables on worker 0 and writes them (a collective; :func:`dump_selected_rows`
chosen rows only, marked by :data:`INCREMENTAL_FILE`); :func:`load_tables` reads
the keys this worker owns under its own world size and assigns their rows
(:mod:`collective.checkpoint.logical` does both halves of the work), so a
dump from N workers loads on M. Eagerly they act at once; in graphs they
build ops.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import logical
from collective.embedding.table import ShardInfo
from collective.runtime import heartbeat

logger = logging.getLogger("collective.sok")

KEYS_SUFFIX = "_keys.file"
INCREMENTAL_FILE = "incremental_dump.json"
"""In a dump directory: it holds chosen rows only (``sok.incremental_dump``), to update a loaded table with."""
VALUES_SUFFIX = "_values.file"
_KEY_DTYPE = np.dtype("<i8")
_SOK_UINT32_KEYS = np.dtype("<u4")  # SOK v1 tables with key_dtype uint32 dump 4-byte keys


def dump_files(directory: str, name: str) -> Tuple[str, str]:
    """The keys and values files of the table ``name`` (an ``m_var_name``) in ``directory``."""
    return os.path.join(directory, name + KEYS_SUFFIX), os.path.join(directory, name + VALUES_SUFFIX)


def dump_tables(where: str, directory, names: Sequence[str], info: ShardInfo,
                tables: Sequence[tf.Variable]) -> tf.Tensor:
    """Writes each of ``tables`` (a table, its slots: ``info``'s rows) as dump ``names[i]`` into ``directory``.

    A collective: every worker calls it for the same tables in the same
    order. Worker 0 gathers the logical table and writes the files; it
    removes the directory's :data:`INCREMENTAL_FILE` left by an incremental
    dump, so a load takes this dump as whole.

    Returns:
      ``b"OK"`` once worker 0 has written every file (a tensor to run in a
      graph, which then fails on every worker if worker 0 could not write;
      eagerly every worker raises ``OSError``).
    """
    written = _write_tables(where, directory, names, info, tables, None, None)
    with tf.control_dependencies([written]):
        return tf.identity(tf.constant(b"OK"))


def dump_selected_rows(where: str, directory, names: Sequence[str], info: ShardInfo,
                       tables: Sequence[tf.Variable], selected: tf.Tensor, description: str) -> tf.Tensor:
    """:func:`dump_tables` of the local rows ``selected`` (bool per local row) of every worker only.

    Worker 0 first writes ``description`` (JSON) as the directory's
    :data:`INCREMENTAL_FILE`, which makes :func:`load_tables` update or
    insert the dumped keys and keep all others. Returns the number of keys
    written (an int64 scalar, the same on every worker).
    """
    return _write_tables(where, directory, names, info, tables, selected, description)


def is_incremental(directory: str) -> bool:
    """Whether the dump in ``directory`` holds chosen rows only (written by :func:`dump_selected_rows`)."""
    return os.path.isfile(os.path.join(_text(directory), INCREMENTAL_FILE))


def incremental_flag(directory):
    """:func:`is_incremental` of ``directory`` now (eagerly, a bool), or when the graph runs (a bool tensor)."""
    if tf.executing_eagerly():
        return is_incremental(_text(directory.numpy() if hasattr(directory, "numpy") else directory))
    flag = tf.numpy_function(lambda path: np.bool_(is_incremental(_text(path))),
                             [tf.convert_to_tensor(directory, tf.string)], tf.bool, stateful=True)
    return tf.reshape(flag, [])


def _write_tables(where: str, directory, names: Sequence[str], info: ShardInfo, tables: Sequence[tf.Variable],
                  selected: Optional[tf.Tensor], description: Optional[str]) -> tf.Tensor:
    """Worker 0 writes the (selected rows of the) tables; returns the number of keys written, on every worker."""
    keys, values = logical.gather_on_rank0(info, tables, selected)
    is_writer = comm.rank() == 0

    def write(path, keys, *values):
        if not is_writer:
            return np.int64(0), np.int64(0), b""
        try:
            _write_description(_text(path), description)
            for name, rows in zip(names, values):
                _write_dump(_text(path), name, keys, rows)
        except OSError as err:
            return np.int64(1), np.int64(0), f"{type(err).__name__}: {err}".encode()
        return np.int64(0), np.int64(len(keys)), b""

    failed, count, message = _numpy_call(write, [tf.convert_to_tensor(directory, tf.string), keys, *values],
                                         [tf.int64, tf.int64, tf.string])
    failed, count = tf.reshape(failed, []), tf.reshape(count, [])
    if comm.world_size() > 1:  # worker 0's status and count reach every worker
        failed, count = tf.unstack(comm.allreduce(tf.stack([failed, count]), "sum"))
    what = f"{where}: worker 0 could not write the dump of {names[0]} into"
    if tf.executing_eagerly():
        if int(failed):
            raise OSError(f"{what} {_text(directory)}: {_text(message.numpy()) or 'see worker 0'}")
        return count
    check = tf.debugging.Assert(tf.equal(failed, 0), [what, directory, message])
    with tf.control_dependencies([check]):
        return tf.identity(count)


def _write_description(directory: str, description: Optional[str]) -> None:
    """Writes (a temporary file, renamed) or, for a whole dump (None), removes ``directory``'s INCREMENTAL_FILE."""
    path = os.path.join(directory, INCREMENTAL_FILE)
    if description is None:
        if os.path.isfile(path):
            os.remove(path)
        return
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}-{threading.get_ident()}"  # a graph writes several tables at once
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(description)
    os.replace(temporary, path)


def load_tables(directory, names: Sequence[str], info: ShardInfo, tables: Sequence[tf.Variable],
                update_only=False, fresh: Sequence[Tuple[tf.Variable, object]] = ()) -> tf.Operation:
    """Assigns each of ``tables`` the rows of dump ``names[i]`` in ``directory`` whose keys this worker owns.

    The keys are read from ``names[0]``. A table without a hash table keeps
    the rows the dump lacks; a hash table then holds exactly the keys read,
    or with ``update_only`` (an incremental dump; a bool, or a bool tensor in a
    graph, see :func:`incremental_flag`) also keeps the others; otherwise every
    row of each ``fresh`` variable is first reset (:func:`logical.assign_owned`).
    """
    dtype = tables[0].dtype.base_dtype
    key_dtype = tf.as_dtype(getattr(tables[0], "m_key_dtype", tf.int64)).name
    rows = None if info.hash_index is not None else info.vocab

    def read(path):
        parts = [_read_owned(_text(path), name, info, dtype.as_numpy_dtype, rows, key_dtype) for name in names]
        return [parts[0][0]] + [values for _, values in parts]

    read_back = _numpy_call(read, [tf.convert_to_tensor(directory, tf.string)], [tf.int64] + [dtype] * len(names))
    return logical.assign_owned(tables, info, read_back[0], read_back[1:], update_only=update_only, fresh=fresh)


def _text(value) -> str:
    """``value`` (bytes from a tensor, or a str) as a str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _numpy_call(fn, inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType]):
    """``fn`` on numpy values: called directly eagerly (its exceptions propagate), else ``tf.numpy_function``."""
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(v, d) for v, d in zip(fn(*[t.numpy() for t in inputs]), dtypes)]
    return tf.numpy_function(fn, list(inputs), list(dtypes), stateful=True)


def _write_dump(directory: str, name: str, keys: np.ndarray, values: np.ndarray) -> None:
    """Writes ``keys`` (ascending) and their rows ``values``, each file to a temporary name first, then renamed."""
    os.makedirs(directory, exist_ok=True)
    values = np.asarray(values)
    with heartbeat.phase("save"):  # the other workers wait for worker 0's files: no stall
        for path, data in zip(dump_files(directory, name), (keys.astype(_KEY_DTYPE),
                                                            values.astype(values.dtype.newbyteorder("<")))):
            temporary = f"{path}.tmp{os.getpid()}"
            with open(temporary, "wb") as out:
                out.write(np.ascontiguousarray(data).tobytes())
            os.replace(temporary, path)
    logger.info("sok: dumped %d keys of %s into %s", len(keys), name, directory)


def _read_owned(directory: str, name: str, info: ShardInfo, value_dtype, rows: Optional[int],
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
    if not count:  # an incremental dump of a table no row of which changed (an empty file cannot be mapped)
        return keys, np.zeros([0, info.dim], value_dtype.newbyteorder("="))
    values = np.memmap(values_path, dtype=value_dtype, mode="r", shape=(count, info.dim))
    return keys[mine], np.asarray(values[mine]).astype(value_dtype.newbyteorder("="))
