"""Argument checks shared by the numpy references and the CuPy wrappers.

Each check takes the array module (``numpy`` or ``cupy``) so that both
implementations refuse the same inputs with the same messages.
"""

from __future__ import annotations

import math
from typing import Any, Optional

COMBINERS = ("sum", "mean", "sqrtn")


def check_ids(xp: Any, ids: Any, name: str = "ids") -> Any:
    """Return ``ids`` as a 1-D int64 array of module ``xp``, or raise ValueError/TypeError."""
    arr = xp.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(arr.shape)}; flatten it first")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8:
        raise TypeError(f"{name} of dtype uint64 may not fit int64; convert to int64 first")
    return arr.astype(xp.int64, copy=False)


def check_num_buckets(num_buckets: int) -> int:
    """Return ``num_buckets`` as an int, refusing values below 1."""
    value = int(num_buckets)
    if value < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets!r}")
    return value


def check_combiner(combiner: str) -> str:
    """Return ``combiner`` if it is one of :data:`COMBINERS`."""
    if combiner not in COMBINERS:
        raise ValueError(f"combiner {combiner!r} is not one of {', '.join(COMBINERS)}")
    return combiner


class TableShape:
    """Capacity and probe-slot count, shared by the reference and the GPU hash tables.

    Args:
      capacity: most keys (rows) the table holds.
      load_factor: fraction of probe slots that may be filled, in (0, 1].
    """

    def __init__(self, capacity: int, load_factor: float) -> None:
        self._num_slots = check_table_shape(capacity, load_factor)
        self._capacity = int(capacity)

    @property
    def capacity(self) -> int:
        """Most keys the table holds."""
        return self._capacity

    @property
    def num_slots(self) -> int:
        """Probe slots (a power of two), not counting the slot kept for the empty-key marker."""
        return self._num_slots


def check_table_shape(capacity: int, load_factor: float) -> int:
    """Return the number of probe slots for ``capacity`` keys at ``load_factor``.

    The slot count is the smallest power of two holding ``capacity / load_factor``.
    """
    if int(capacity) < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity!r}")
    if not 0.0 < float(load_factor) <= 1.0:
        raise ValueError(f"load_factor must be in (0, 1], got {load_factor!r}")
    wanted = max(1, math.ceil(int(capacity) / float(load_factor)))
    return 1 << (wanted - 1).bit_length()


def check_segments(
    xp: Any,
    segment_ids: Any,
    num_rows: int,
    weights: Optional[Any],
    dtype: Any,
) -> tuple:
    """Check segment ids (1-D ints, one per row) and weights (None or 1-D, one per row).

    Returns ``(segment_ids as int64, weights as dtype or None)``. Range checks
    against the number of segments are left to the caller.
    """
    seg = check_ids(xp, segment_ids, "segment_ids")
    if seg.shape[0] != num_rows:
        raise ValueError(f"segment_ids has {seg.shape[0]} entries but there are {num_rows} rows; give one per row")
    if weights is None:
        return seg, None
    w = xp.asarray(weights)
    if w.ndim != 1 or w.shape[0] != num_rows:
        raise ValueError(f"weights must have shape ({num_rows},), got {tuple(w.shape)}")
    return seg, w.astype(dtype, copy=False)


def check_float_matrix(xp: Any, values: Any, name: str) -> Any:
    """Return ``values`` as a 2-D float32/float64 array of module ``xp``."""
    arr = xp.asarray(values)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, dim], got shape {tuple(arr.shape)}")
    if arr.dtype not in (xp.float32, xp.float64):
        raise TypeError(f"{name} must be float32 or float64, got dtype {arr.dtype}")
    return arr


def check_segment_range(xp: Any, segment_ids: Any, num_segments: int) -> None:
    """Raise ValueError quoting the first segment id outside ``[0, num_segments)``."""
    if segment_ids.shape[0] == 0:
        return
    outside = (segment_ids < 0) | (segment_ids >= num_segments)
    if bool(outside.any()):
        bad = int(segment_ids[outside][0])
        raise ValueError(f"segment id {bad} is outside [0, {num_segments}); check the segment ids or num_segments")
