"""Numpy references that define what every GPU kernel computes.

Each function here has the signature of its CuPy twin in
:mod:`collective.kernels.cupy_ops`; a kernel is correct when it returns what
the reference returns (exactly for integer results, up to float summation
order for the combiners).

Conventions shared with the kernels:

* ids and keys are int64; every int64 value is a valid key, including
  ``INT64_MIN``, which the tables use internally as their empty-slot marker
  and store in a slot of its own.
* the owner bucket of an id is ``id % num_buckets`` with Python's (floor)
  modulo, so negative ids land in ``[0, num_buckets)`` like ``tf.math.floormod``.
* index outputs (counts, permutations, inverse, rows) are int64.
"""

from __future__ import annotations

from typing import Optional, Tuple

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

EMPTY_KEY = np.iinfo(np.int64).min
"""The int64 value that marks an empty slot (stored in a dedicated slot when it is a key)."""

# MurmurHash3's 64-bit finaliser (fmix64): shift, multiply, shift, multiply, shift. The one definition of
# its constants; collective.embedding.key_init computes the same function with TensorFlow ops.
FMIX64_SHIFT = 33
FMIX64_MUL1 = 0xFF51AFD7ED558CCD
FMIX64_MUL2 = 0xC4CEB9FE1A85EC53
_MIX1 = np.uint64(FMIX64_MUL1)
_MIX2 = np.uint64(FMIX64_MUL2)
_SHIFT = np.uint64(FMIX64_SHIFT)


def hash_slots(keys: np.ndarray, num_slots: int) -> np.ndarray:
    """Home slot of each key: MurmurHash3's 64-bit finaliser, masked to ``num_slots`` (a power of two).

    The CUDA tables use the same function, so keys that collide here collide there.
    """
    k = np.asarray(keys, dtype=np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        k ^= k >> _SHIFT
        k *= _MIX1
        k ^= k >> _SHIFT
        k *= _MIX2
        k ^= k >> _SHIFT
    return (k & np.uint64(num_slots - 1)).astype(np.int64)


def partition(ids: np.ndarray, num_buckets: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group ids by owner ``id % num_buckets``, keeping their order within each bucket.

    Args:
      ids: 1-D integer ids.
      num_buckets: number of owners (workers), >= 1.

    Returns:
      ``(bucketed_ids, counts, restore_perm)``: ``bucketed_ids`` holds bucket
      0's ids, then bucket 1's, ..., each in input order; ``counts[b]`` is the
      size of bucket ``b``; ``restore_perm[i]`` is where input ``i`` went, so
      ``bucketed_ids[restore_perm]`` equals ``ids``.
    """
    ids = check_ids(np, ids)
    num_buckets = check_num_buckets(num_buckets)
    buckets = ids % num_buckets
    order = np.argsort(buckets, kind="stable")
    restore = np.empty(ids.shape[0], dtype=np.int64)
    restore[order] = np.arange(ids.shape[0], dtype=np.int64)
    counts = np.bincount(buckets, minlength=num_buckets).astype(np.int64)
    return ids[order], counts, restore


def unique(ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct ids in order of first occurrence, with the inverse index and counts.

    Returns:
      ``(uniques, inverse, counts)`` with ``uniques[inverse]`` equal to
      ``ids`` and ``counts[j]`` the number of occurrences of ``uniques[j]``
      (like ``tf.unique_with_counts``).
    """
    ids = check_ids(np, ids)
    sorted_uniques, first, inverse, counts = np.unique(
        ids, return_index=True, return_inverse=True, return_counts=True
    )
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0], dtype=np.int64)
    return sorted_uniques[order], rank[inverse.reshape(-1)], counts[order].astype(np.int64)


class HashTable(TableShape):
    """Open-addressing int64 key -> int64 row table with linear probing.

    Rows are handed out densely: the first new key gets row ``size``, the next
    ``size + 1``, ..., in order of first occurrence within a batch, so the
    rows index a ``[capacity, dim]`` embedding variable.

    Args:
      capacity: most keys (rows) the table holds.
      load_factor: fraction of probe slots that may be filled; the slot count
        is the smallest power of two >= ``capacity / load_factor``.
    """

    def __init__(self, capacity: int, load_factor: float = 0.5) -> None:
        super().__init__(capacity, load_factor)
        # One extra slot, at index num_slots, holds EMPTY_KEY when it is a key.
        self._keys = np.full(self._num_slots + 1, EMPTY_KEY, dtype=np.int64)
        self._rows = np.full(self._num_slots + 1, -1, dtype=np.int64)
        self._size = 0

    @property
    def size(self) -> int:
        """Keys inserted so far."""
        return self._size

    def _slot(self, key: int, home: int) -> int:
        """Slot holding ``key``, or the empty slot where it would go, or -1 if neither exists."""
        if key == EMPTY_KEY:
            return self._num_slots
        slot = home
        for _ in range(self._num_slots):
            current = self._keys[slot]
            if current == key or current == EMPTY_KEY:
                return slot
            slot = (slot + 1) & (self._num_slots - 1)
        return -1

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 for keys not in the table."""
        keys = check_ids(np, keys, "keys")
        homes = hash_slots(keys, self._num_slots)
        out = np.full(keys.shape[0], -1, dtype=np.int64)
        for i, (key, home) in enumerate(zip(keys.tolist(), homes.tolist())):
            slot = self._slot(key, home)
            if slot >= 0 and self._keys[slot] == key:
                out[i] = self._rows[slot]
        return out

    def insert_or_find(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, inserting missing keys first.

        Raises:
          HashTableFullError: the new keys do not fit; the table is unchanged.
        """
        keys = check_ids(np, keys, "keys")
        rows = self.find(keys)
        new_keys = unique(keys[rows < 0])[0]
        if self._size + new_keys.shape[0] > self._capacity:
            raise HashTableFullError(self._capacity, self._size, int(new_keys.shape[0]))
        homes = hash_slots(new_keys, self._num_slots)
        for key, home in zip(new_keys.tolist(), homes.tolist()):
            slot = self._slot(key, home)
            self._keys[slot] = key
            self._rows[slot] = self._size
            self._size += 1
        return self.find(keys)

    def export(self) -> Tuple[np.ndarray, np.ndarray]:
        """All ``(keys, rows)`` in the table, ordered by row."""
        held = self._rows >= 0
        order = np.argsort(self._rows[held], kind="stable")
        return self._keys[held][order], self._rows[held][order]


def _row_scales(
    segment_ids: np.ndarray,
    num_segments: int,
    weights: Optional[np.ndarray],
    combiner: str,
    dtype: np.dtype,
) -> np.ndarray:
    """Factor each row is multiplied by before it is summed into its segment.

    ``w_i`` for sum, ``w_i / sum(w)`` for mean, ``w_i / sqrt(sum(w^2))`` for
    sqrtn (sums over the row's segment); 0 where the divisor is 0.
    """
    w = np.ones(segment_ids.shape[0], dtype=np.float64) if weights is None else weights.astype(np.float64)
    if combiner == "sum":
        return w.astype(dtype)
    if combiner == "mean":
        divisor = np.bincount(segment_ids, weights=w, minlength=num_segments)
    else:
        divisor = np.sqrt(np.bincount(segment_ids, weights=w * w, minlength=num_segments))
    d = divisor[segment_ids]
    safe = np.where(d != 0, d, 1.0)
    return np.where(d != 0, w / safe, 0.0).astype(dtype)


def segment_combine(
    values: np.ndarray,
    segment_ids: np.ndarray,
    num_segments: int,
    weights: Optional[np.ndarray] = None,
    combiner: str = "sum",
) -> np.ndarray:
    """Combine rows into segments: ``out[s] = sum_{i in s} scale_i * values[i]``.

    Args:
      values: ``[rows, dim]`` float32 or float64.
      segment_ids: ``[rows]`` ints in ``[0, num_segments)``, in any order.
      num_segments: rows of the output.
      weights: optional ``[rows]`` per-row weights (1 when omitted).
      combiner: ``sum``, ``mean`` (divide by the segment's weight sum) or
        ``sqrtn`` (divide by the root of its sum of squared weights), as in
        ``tf.nn.embedding_lookup_sparse``; segments with no rows or a zero
        divisor give zeros.

    Returns:
      ``[num_segments, dim]`` of the values' dtype.
    """
    values = check_float_matrix(np, values, "values")
    check_combiner(combiner)
    seg, w = check_segments(np, segment_ids, values.shape[0], weights, values.dtype)
    check_segment_range(np, seg, int(num_segments))
    scale = _row_scales(seg, int(num_segments), w, combiner, values.dtype)
    out = np.zeros((int(num_segments), values.shape[1]), dtype=values.dtype)
    np.add.at(out, seg, values * scale[:, None])
    return out


def segment_combine_grad(
    grad: np.ndarray,
    segment_ids: np.ndarray,
    weights: Optional[np.ndarray] = None,
    combiner: str = "sum",
) -> np.ndarray:
    """Gradient of :func:`segment_combine` with respect to ``values``.

    Args:
      grad: ``[num_segments, dim]`` gradient of the combined output.
      segment_ids, weights, combiner: as given to :func:`segment_combine`.

    Returns:
      ``[rows, dim]``: ``scale_i * grad[segment_ids[i]]``. Weights are treated
      as constants (no gradient flows to them).
    """
    grad = check_float_matrix(np, grad, "grad")
    check_combiner(combiner)
    seg = check_ids(np, segment_ids, "segment_ids")
    seg, w = check_segments(np, seg, seg.shape[0], weights, grad.dtype)
    check_segment_range(np, seg, grad.shape[0])
    scale = _row_scales(seg, grad.shape[0], w, combiner, grad.dtype)
    return grad[seg] * scale[:, None]
