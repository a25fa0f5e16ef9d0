"""Turns a worker's pieces into fixed-size batches of numpy arrays, without TensorFlow.

Rows move only as whole Arrow tables: a row group is read in one call, a
shuffle window is permuted with one ``take``, a batch is one ``slice``, and a
column becomes numpy without a per-row Python loop. List columns come out as
``(values, row_splits)``.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collective.data.files import DataError
from collective.data.sharding import Piece

logger = logging.getLogger("collective.data")

Column = Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]


def is_list(type_: pa.DataType) -> bool:
    return pa.types.is_list(type_) or pa.types.is_large_list(type_)


def numpy_dtype(type_: pa.DataType) -> np.dtype:
    """The numpy dtype a column (or a list column's values) is delivered in."""
    if is_list(type_):
        type_ = type_.value_type
    if pa.types.is_integer(type_):
        return np.dtype(np.int64)
    if pa.types.is_float16(type_) or pa.types.is_float32(type_):
        return np.dtype(np.float32)
    if pa.types.is_float64(type_):
        return np.dtype(np.float64)
    if pa.types.is_boolean(type_):
        return np.dtype(np.bool_)
    if pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_binary(type_):
        return np.dtype(object)
    raise DataError(f"columns of type {type_} are not supported; store ints, floats, bools, strings or lists of them")


def column_to_numpy(name: str, column: Union[pa.ChunkedArray, pa.Array]) -> Column:
    """One column as numpy: an array, or ``(values, row_splits)`` for a list column (a null list is empty)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if is_list(array.type):
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        splits = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=splits[1:])
        values = array.flatten()
        if values.null_count:
            raise DataError(f"list column {name!r} holds null values inside its lists; fill them when writing the file")
        return values.to_numpy(zero_copy_only=False).astype(numpy_dtype(array.type), copy=False), splits
    return array.to_numpy(zero_copy_only=False).astype(numpy_dtype(array.type), copy=False)


def table_to_numpy(table: pa.Table) -> Dict[str, Column]:
    """Every column of ``table`` as numpy, by name."""
    return {name: column_to_numpy(name, table.column(name)) for name in table.column_names}


def _read_piece(files: Dict[str, pq.ParquetFile], piece: Piece, columns: Sequence[str]) -> pa.Table:
    handle = files.get(piece.path)
    if handle is None:
        handle = files[piece.path] = pq.ParquetFile(piece.path)
    table = handle.read_row_group(piece.row_group, columns=list(columns))
    if piece.first_row or piece.num_rows != table.num_rows:
        table = table.slice(piece.first_row, piece.num_rows)
    for name in table.column_names:
        column = table.column(name)
        if column.null_count and not is_list(column.type):
            raise DataError(f"column {name!r} in {piece.path!r} (row group {piece.row_group}) has "
                            f"{column.null_count} null value(s); fill them when writing the file "
                            "(the Criteo converter writes 0)")
    return table


def _cut(pending: List[pa.Table], rng: Optional[np.random.Generator],
         batch_size: int) -> Tuple[List[pa.Table], pa.Table]:
    """Joins ``pending``, permutes it when shuffling, and cuts it into full batches and a rest."""
    table = pa.concat_tables(pending)
    if rng is not None:
        table = table.take(pa.array(rng.permutation(table.num_rows)))
    full = (table.num_rows // batch_size) * batch_size
    return [table.slice(start, batch_size) for start in range(0, full, batch_size)], table.slice(full)


def iterate_batches(pieces: Sequence[Piece], columns: Sequence[str], batch_size: int, *,
                    shuffle_buffer: int = 0, seed: Optional[int] = None, num_epochs: Optional[int] = 1,
                    drop_remainder: bool = False) -> Iterator[Dict[str, Column]]:
    """Yields dicts of numpy columns of ``batch_size`` rows (the last may be short unless ``drop_remainder``).

    With ``shuffle_buffer > 0`` the order of pieces is shuffled every epoch
    and rows are shuffled within windows of at least ``shuffle_buffer`` rows,
    all from ``seed`` (and the epoch number), so a run is reproducible.
    ``num_epochs=None`` repeats forever.
    """
    if batch_size < 1:
        raise DataError(f"batch_size={batch_size} must be at least 1")
    if not pieces:
        return
    files: Dict[str, pq.ParquetFile] = {}
    window = max(batch_size, shuffle_buffer)
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
        rng = np.random.default_rng([seed if seed is not None else 0, epoch]) if shuffle_buffer else None
        order = rng.permutation(len(pieces)) if rng is not None else range(len(pieces))
        pending: List[pa.Table] = []
        rows = 0
        for i in order:
            table = _read_piece(files, pieces[i], columns)
            pending.append(table)
            rows += table.num_rows
            if rows >= window:
                batches, rest = _cut(pending, rng, batch_size)
                yield from (table_to_numpy(batch) for batch in batches)
                pending, rows = [rest], rest.num_rows
        if rows:
            batches, rest = _cut(pending, rng, batch_size)
            yield from (table_to_numpy(batch) for batch in batches)
            if rest.num_rows and not drop_remainder:
                yield table_to_numpy(rest)
        epoch += 1
