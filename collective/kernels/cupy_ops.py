"""CuPy implementations of the id kernels, with DLPack hand-off to TensorFlow.

Every function here has the signature of its numpy reference in
:mod:`collective.kernels.reference`, takes CuPy (or array-like) inputs and
returns CuPy arrays. The CUDA sources are the ``.cu`` files next to this
module, compiled by CuPy (NVRTC) the first time a kernel is used on a device.

CuPy is imported lazily: importing this module works without it, and the
first call raises an ImportError that says to install the ``gpu`` extra.
"""

from __future__ import annotations

import functools
import logging
import pathlib
from typing import Any, Optional, Tuple

import numpy as np

from .errors import HashTableFullError
from .validation import (
    check_combiner,
    check_float_matrix,
    check_ids,
    check_num_buckets,
    check_segment_range,
    check_segments,
    TableShape,
)

logger = logging.getLogger(__name__)

KERNEL_DIR = pathlib.Path(__file__).resolve().parent
"""Directory holding the ``.cu`` sources."""

_THREADS = 256
_MAX_BLOCKS = 1 << 20
_SHARED_BYTES = 48 * 1024  # default dynamic shared memory limit per block
_EMPTY_KEY = np.iinfo(np.int64).min
_NO_INDEX = np.iinfo(np.int64).max
_COMBINER_CODES = {"sum": 0, "mean": 1, "sqrtn": 2}


def _cupy() -> Any:
    """The cupy module, or an ImportError saying how to get it."""
    try:
        import cupy
    except ImportError as error:
        raise ImportError(
            "collective.kernels.cupy_ops needs CuPy, which is not installed; install the gpu extra "
            "(pip install 'collective[gpu]', which brings cupy-cuda12x) on a machine with a CUDA GPU, "
            "or use the numpy references in collective.kernels.reference"
        ) from error
    return cupy


@functools.lru_cache(maxsize=None)
def _module(filename: str) -> Any:
    """The compiled RawModule of ``KERNEL_DIR / filename`` (compiled once per process)."""
    cp = _cupy()
    source = (KERNEL_DIR / filename).read_text()
    logger.debug("loading CUDA module %s", filename)
    return cp.RawModule(code=source, options=("--std=c++17",))


def _kernel(filename: str, name: str) -> Any:
    return _module(filename).get_function(name)


def _grid(n: int) -> Tuple[int]:
    """Blocks for a grid-stride loop over ``n`` items."""
    return (max(1, min(-(-n // _THREADS), _MAX_BLOCKS)),)


def _i64(value: int) -> np.int64:
    return np.int64(value)


# ---------------------------------------------------------------- partition


def partition_by_sort(ids: Any, num_buckets: int) -> Tuple[Any, Any, Any]:
    """:func:`partition` by a sort of ``(bucket, position)`` keys: the library baseline and large-N fallback."""
    cp = _cupy()
    ids = check_ids(cp, ids)
    num_buckets = check_num_buckets(num_buckets)
    n = ids.shape[0]
    buckets = ids % num_buckets
    order = cp.argsort(buckets * max(n, 1) + cp.arange(n, dtype=cp.int64))
    restore = cp.empty(n, dtype=cp.int64)
    restore[order] = cp.arange(n, dtype=cp.int64)
    counts = cp.bincount(buckets, minlength=num_buckets).astype(cp.int64)
    return ids[order], counts, restore


def partition(ids: Any, num_buckets: int) -> Tuple[Any, Any, Any]:
    """Group ids by owner ``id % num_buckets``, stable within buckets.

    Same contract as :func:`collective.kernels.reference.partition`:
    returns ``(bucketed_ids, counts, restore_perm)`` with
    ``bucketed_ids[restore_perm] == ids``. Uses a count / scan / scatter pass
    (``partition.cu``) for up to 6144 buckets and a sort beyond that.
    """
    cp = _cupy()
    ids = cp.ascontiguousarray(check_ids(cp, ids))
    num_buckets = check_num_buckets(num_buckets)
    n = ids.shape[0]
    if n == 0:
        return cp.empty(0, cp.int64), cp.zeros(num_buckets, cp.int64), cp.empty(0, cp.int64)
    if 8 * num_buckets > _SHARED_BYTES or n >= 2**31:
        return partition_by_sort(ids, num_buckets)
    warps_per_block = max(1, min(8, _SHARED_BYTES // (8 * num_buckets)))
    items_per_warp = max(512, 32 * -(-4 * num_buckets // 32))  # keeps the count matrix <= n / 4
    num_chunks = -(-n // items_per_warp)
    blocks = (-(-num_chunks // warps_per_block),)
    threads = (32 * warps_per_block,)
    chunk_counts = cp.empty(num_buckets * num_chunks, dtype=cp.int32)
    _kernel("partition.cu", "partition_count")(
        blocks, threads,
        (ids, _i64(n), np.int32(num_buckets), np.int32(items_per_warp), _i64(num_chunks), chunk_counts),
        shared_mem=4 * warps_per_block * num_buckets,
    )
    offsets = cp.cumsum(chunk_counts, dtype=cp.int64)
    offsets -= chunk_counts
    counts = chunk_counts.reshape(num_buckets, num_chunks).sum(axis=1, dtype=cp.int64)
    bucketed = cp.empty(n, dtype=cp.int64)
    restore = cp.empty(n, dtype=cp.int64)
    _kernel("partition.cu", "partition_scatter")(
        blocks, threads,
        (ids, _i64(n), np.int32(num_buckets), np.int32(items_per_warp), _i64(num_chunks), offsets, bucketed, restore),
        shared_mem=8 * warps_per_block * num_buckets,
    )
    return bucketed, counts, restore


# ------------------------------------------------------------------- unique


def unique(ids: Any) -> Tuple[Any, Any, Any]:
    """Distinct ids in first-occurrence order, inverse index and counts.

    Same contract as :func:`collective.kernels.reference.unique`; built on a
    scratch hash table of at least ``2 * len(ids)`` slots (``hash_table.cu``).
    Synchronises once, to size the output.
    """
    cp = _cupy()
    ids = cp.ascontiguousarray(check_ids(cp, ids))
    n = ids.shape[0]
    if n == 0:
        return cp.empty(0, cp.int64), cp.empty(0, cp.int64), cp.empty(0, cp.int64)
    num_slots = 1 << (2 * n - 1).bit_length()
    table_keys = cp.full(num_slots + 1, _EMPTY_KEY, dtype=cp.int64)
    first = cp.full(num_slots + 1, _NO_INDEX, dtype=cp.int64)
    count = cp.zeros(num_slots + 1, dtype=cp.uint64)
    slot_of = cp.empty(n, dtype=cp.int64)
    grid, threads = _grid(n), (_THREADS,)
    _kernel("hash_table.cu", "unique_insert")(
        grid, threads, (table_keys, np.uint64(num_slots - 1), ids, _i64(n), slot_of, first, count)
    )
    is_first = cp.empty(n, dtype=cp.int64)
    _kernel("hash_table.cu", "unique_flag_first")(grid, threads, (slot_of, first, _i64(n), is_first))
    rank = cp.cumsum(is_first)
    num_unique = int(rank[-1])
    uniques = cp.empty(num_unique, dtype=cp.int64)
    counts = cp.empty(num_unique, dtype=cp.int64)
    _kernel("hash_table.cu", "unique_emit")(
        grid, threads, (ids, slot_of, is_first, rank, count, _i64(n), first, uniques, counts)
    )
    inverse = cp.empty(n, dtype=cp.int64)
    _kernel("hash_table.cu", "unique_inverse")(grid, threads, (slot_of, first, _i64(n), inverse))
    return uniques, inverse, counts


# --------------------------------------------------------------- hash table


class HashTable(TableShape):
    """GPU open-addressing int64 key -> int64 row table (``hash_table.cu``).

    Same contract as :class:`collective.kernels.reference.HashTable`: rows are
    handed out densely in order of first occurrence within each batch.
    ``find`` never synchronises; ``insert_or_find`` synchronises once, to
    check that the new keys fit.

    Args:
      capacity: most keys (rows) the table holds.
      load_factor: fraction of probe slots that may be filled.
    """

    def __init__(self, capacity: int, load_factor: float = 0.5) -> None:
        cp = _cupy()
        super().__init__(capacity, load_factor)
        # (key, row) pairs; pair num_slots holds EMPTY_KEY when it is a key.
        self._slots = cp.empty(2 * (self._num_slots + 1), dtype=cp.int64)
        self._slots[0::2] = _EMPTY_KEY
        self._slots[1::2] = -1
        self._first = cp.full(self._num_slots + 1, _NO_INDEX, dtype=cp.int64)
        self._status = cp.zeros(2, dtype=cp.int64)  # [size, probe sequence exhausted]

    @property
    def size(self) -> int:
        """Keys inserted so far (synchronises)."""
        return int(self._status[0])

    def _mask(self) -> np.uint64:
        return np.uint64(self._num_slots - 1)

    def find(self, keys: Any) -> Any:
        """Row of each key, -1 for keys not in the table."""
        cp = _cupy()
        keys = cp.ascontiguousarray(check_ids(cp, keys, "keys"))
        n = keys.shape[0]
        rows = cp.empty(n, dtype=cp.int64)
        if n:
            _kernel("hash_table.cu", "ht_find")(_grid(n), (_THREADS,), (self._slots, self._mask(), keys, _i64(n), rows))
        return rows

    def insert_or_find(self, keys: Any) -> Any:
        """Row of each key, inserting missing keys first.

        Raises:
          HashTableFullError: the new keys do not fit. No key gets a row, but
            the keys may keep probe slots, so rebuild a larger table.
        """
        cp = _cupy()
        keys = cp.ascontiguousarray(check_ids(cp, keys, "keys"))
        n = keys.shape[0]
        if n == 0:
            return cp.empty(0, dtype=cp.int64)
        grid, threads = _grid(n), (_THREADS,)
        slot_of = cp.empty(n, dtype=cp.int64)
        _kernel("hash_table.cu", "ht_insert")(
            grid, threads, (self._slots, self._mask(), keys, _i64(n), slot_of, self._first, self._status)
        )
        is_new = cp.empty(n, dtype=cp.int64)
        _kernel("hash_table.cu", "ht_flag_new")(grid, threads, (self._slots, slot_of, self._first, _i64(n), is_new))
        new_rank = cp.cumsum(is_new)
        size, exhausted, new_keys = (int(v) for v in cp.concatenate([self._status, new_rank[-1:]]).get())
        if exhausted or size + new_keys > self._capacity:
            _kernel("hash_table.cu", "ht_clear_first")(grid, threads, (slot_of, self._first, _i64(n)))
            self._status[1] = 0
            if exhausted:
                new_keys += int((slot_of < 0).sum())
            raise HashTableFullError(self._capacity, size, new_keys)
        _kernel("hash_table.cu", "ht_assign")(
            grid, threads, (self._slots, slot_of, self._first, is_new, new_rank, _i64(n), self._status)
        )
        self._status[0:1] += new_rank[-1:]
        rows = cp.empty(n, dtype=cp.int64)
        _kernel("hash_table.cu", "ht_rows_of_slots")(grid, threads, (self._slots, slot_of, _i64(n), rows))
        return rows

    def export(self) -> Tuple[Any, Any]:
        """All ``(keys, rows)`` in the table, ordered by row."""
        cp = _cupy()
        keys, rows = self._slots[0::2], self._slots[1::2]
        held = rows >= 0
        keys, rows = keys[held], rows[held]
        order = cp.argsort(rows)
        return keys[order], rows[order]


# ---------------------------------------------------------------- combiners


def _row_scales(cp: Any, seg: Any, weights: Optional[Any], num_segments: int, combiner: str, dtype: Any) -> Any:
    """Per-row factors (see ``segment_combine.cu``); raises on segment ids out of range."""
    suffix = "f32" if dtype == cp.float32 else "f64"
    n = seg.shape[0]
    has_weights = np.int32(weights is not None)
    w = cp.ascontiguousarray(weights) if weights is not None else cp.empty(1, dtype=dtype)
    divisor = cp.zeros(max(num_segments, 1), dtype=dtype)
    bad_segment = cp.zeros(1, dtype=cp.int32)
    code = np.int32(_COMBINER_CODES[combiner])
    grid, threads = _grid(n), (_THREADS,)
    _kernel("segment_combine.cu", f"segment_weight_sums_{suffix}")(
        grid, threads, (seg, w, has_weights, _i64(n), _i64(num_segments), code, divisor, bad_segment)
    )
    if int(bad_segment[0]):
        check_segment_range(cp, seg, num_segments)
    scale = cp.empty(n, dtype=dtype)
    _kernel("segment_combine.cu", f"segment_row_scales_{suffix}")(
        grid, threads, (seg, w, has_weights, _i64(n), _i64(num_segments), code, divisor, scale)
    )
    return scale


def _prepare_segments(
    cp: Any, matrix: Any, name: str, segment_ids: Any, weights: Optional[Any], combiner: str
) -> Tuple[Any, Any, Optional[Any], str]:
    """Checked ``(matrix, segment ids, weights, dtype suffix)`` for the segment kernels."""
    matrix = cp.ascontiguousarray(check_float_matrix(cp, matrix, name))
    check_combiner(combiner)
    seg = check_ids(cp, segment_ids, "segment_ids")
    rows = matrix.shape[0] if name == "values" else seg.shape[0]
    seg, w = check_segments(cp, seg, rows, weights, matrix.dtype)
    return matrix, cp.ascontiguousarray(seg), w, "f32" if matrix.dtype == cp.float32 else "f64"


def _run_rows_by_columns(
    cp: Any, kernel: Any, matrix: Any, seg: Any, w: Optional[Any], combiner: str, num_segments: int, out: Any
) -> Any:
    """Launch a (row, column) segment kernel on ``matrix`` into ``out`` after computing the row scales."""
    n, dim = seg.shape[0], matrix.shape[1]
    scale = _row_scales(cp, seg, w, num_segments, combiner, matrix.dtype)
    kernel(_grid(n * dim), (_THREADS,), (matrix, seg, scale, _i64(n), _i64(dim), _i64(num_segments), out))
    return out


def segment_combine(
    values: Any,
    segment_ids: Any,
    num_segments: int,
    weights: Optional[Any] = None,
    combiner: str = "sum",
) -> Any:
    """Combine ``[rows, dim]`` values into ``[num_segments, dim]`` by sum, mean or sqrtn.

    Same contract as :func:`collective.kernels.reference.segment_combine`
    (float atomics: equal up to summation order). Synchronises once, to
    check the segment ids.
    """
    cp = _cupy()
    values, seg, w, suffix = _prepare_segments(cp, values, "values", segment_ids, weights, combiner)
    out = cp.zeros((int(num_segments), values.shape[1]), dtype=values.dtype)
    if seg.shape[0] == 0:
        return out
    kernel = _kernel("segment_combine.cu", f"segment_scatter_add_{suffix}")
    return _run_rows_by_columns(cp, kernel, values, seg, w, combiner, int(num_segments), out)


def segment_combine_grad(
    grad: Any,
    segment_ids: Any,
    weights: Optional[Any] = None,
    combiner: str = "sum",
) -> Any:
    """Gradient of :func:`segment_combine` with respect to its values: ``[rows, dim]``.

    Same contract as :func:`collective.kernels.reference.segment_combine_grad`.
    """
    cp = _cupy()
    grad, seg, w, suffix = _prepare_segments(cp, grad, "grad", segment_ids, weights, combiner)
    grad_values = cp.empty((seg.shape[0], grad.shape[1]), dtype=grad.dtype)
    if seg.shape[0] == 0:
        return grad_values
    kernel = _kernel("segment_combine.cu", f"segment_gather_scale_{suffix}")
    return _run_rows_by_columns(cp, kernel, grad, seg, w, combiner, grad.shape[0], grad_values)


# ------------------------------------------------------------------- DLPack


def to_cupy(tensor: Any) -> Any:
    """A CuPy view of a TensorFlow GPU tensor (DLPack, no copy)."""
    cp = _cupy()
    import tensorflow as tf

    return cp.from_dlpack(tf.experimental.dlpack.to_dlpack(tensor))


def to_tf(array: Any) -> Any:
    """A TensorFlow tensor sharing a CuPy array's memory (DLPack, no copy)."""
    _cupy()
    import tensorflow as tf

    return tf.experimental.dlpack.from_dlpack(array.toDlpack())


__all__ = [
    "HashTable",
    "HashTableFullError",
    "KERNEL_DIR",
    "partition",
    "partition_by_sort",
    "segment_combine",
    "segment_combine_grad",
    "to_cupy",
    "to_tf",
    "unique",
]
