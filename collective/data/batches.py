"""Turns a worker's pieces into fixed-size batches of numpy arrays, without TensorFlow.

Rows move only as whole Arrow tables: a row group is read in one call and a
shuffle window is permuted with one ``take``. Each Arrow chunk of a window
becomes numpy once, without a per-row Python loop, and its batches are views
of it (only a batch spanning two chunks is copied). List columns come out as
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
         batch_size: int) -> Tuple[pa.Table, pa.Table]:
    """Joins ``pending``, permutes it when shuffling, and cuts it into whole batches and a rest."""
    table = pa.concat_tables(pending)
    if rng is not None:
        table = table.take(pa.array(rng.permutation(table.num_rows)))
    full = (table.num_rows // batch_size) * batch_size
    return table.slice(0, full), table.slice(full)


def _slice(column: Column, start: int, stop: int) -> Column:
    """Rows ``[start, stop)`` of a numpy column: a view (list columns: values view, rebased row splits)."""
    if isinstance(column, tuple):
        values, splits = column
        part = splits[start:stop + 1]
        return values[part[0]:part[-1]], part - part[0]
    return column[start:stop]


def _split_column(name: str, column: pa.ChunkedArray, batch_size: int) -> List[Column]:
    """``column`` as numpy batches of ``batch_size`` rows (the last may be short).

    Each Arrow chunk becomes numpy once and a batch inside it is a view; only
    a batch that spans chunks is joined (copied).
    """
    bounds = np.cumsum([0] + [len(chunk) for chunk in column.chunks])
    converted: Dict[int, Column] = {}
    batches: List[Column] = []
    for start in range(0, len(column), batch_size):
        stop = min(start + batch_size, len(column))
        i = int(np.searchsorted(bounds, start, side="right")) - 1
        if stop <= bounds[i + 1]:
            if i not in converted:
                converted[i] = column_to_numpy(name, column.chunk(i))
            batches.append(_slice(converted[i], start - int(bounds[i]), stop - int(bounds[i])))
        else:
            batches.append(column_to_numpy(name, column.slice(start, stop - start)))
    return batches


def _batches(table: pa.Table, batch_size: int) -> Iterator[Dict[str, Column]]:
    """``table`` as dicts of numpy columns of ``batch_size`` rows (the last may be short)."""
    if not table.num_rows:
        return
    columns = {name: _split_column(name, table.column(name), batch_size) for name in table.column_names}
    for i in range((table.num_rows + batch_size - 1) // batch_size):
        yield {name: batches[i] for name, batches in columns.items()}


def iterate_batches(pieces: Sequence[Piece], columns: Sequence[str], batch_size: int, *,
                    shuffle_buffer: int = 0, seed: Optional[int] = None, num_epochs: Optional[int] = 1,
                    drop_remainder: bool = False) -> Iterator[Dict[str, Column]]:
    """Yields dicts of numpy columns of ``batch_size`` rows (the last may be short unless ``drop_remainder``).

    With ``shuffle_buffer > 0`` the order of pieces is shuffled every epoch
    and rows are shuffled within windows of at least ``shuffle_buffer`` rows,
    all from ``seed`` (and the epoch number), so a run is reproducible.
    ``num_epochs=None`` repeats forever. Arrays are read-only views into the
    window they were cut from; copy one to keep it apart from the rest.
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
                full, rest = _cut(pending, rng, batch_size)
                yield from _batches(full, batch_size)
                pending, rows = [rest], rest.num_rows
        if rows:
            full, rest = _cut(pending, rng, batch_size)
            yield from _batches(full, batch_size)
            if rest.num_rows and not drop_remainder:
                yield from _batches(rest, batch_size)
        epoch += 1
