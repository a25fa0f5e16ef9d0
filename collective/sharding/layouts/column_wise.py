"""The ``column_wise`` layout: every rank holds every row, a slice of its dims.

Rank ``r`` of ``N`` holds columns ``[lo_r, hi_r)`` of the logical
``[vocab, dim]`` table: ``dim // N`` each, the first ``dim % N`` ranks one
more (:func:`column_bounds`). The planner refuses a table with fewer dims
than workers, so every rank holds at least one column. Every id is held
here at local row ``id``; the exchange allgathers the ids, each rank
gathers its slice of every id, and one alltoall returns each rank the
slices of its own ids, which it joins along the dims
(:mod:`collective.embedding.exchanges.column_wise`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Tuple

import tensorflow as tf


def column_bounds(dim: int, world_size: int) -> List[int]:
    """Column bounds of the ``world_size`` slices of a ``dim``-wide row (the first ``dim % N`` one wider)."""
    sizes = [dim // world_size + int(r < dim % world_size) for r in range(world_size)]
    return [sum(sizes[:r]) for r in range(world_size + 1)]


@dataclasses.dataclass(frozen=True)
class ColumnWiseLayout:
    """Rank ``rank`` of ``world_size``'s view of a ``dim``-wide table sliced by columns."""

    rank: int
    world_size: int
    dim: int

    replicated = False
    sharded = False  # rows are not spread: every rank holds every row

    def columns(self) -> Tuple[int, int]:
        """``(lo, hi)``: the logical columns this rank holds."""
        bounds = column_bounds(self.dim, self.world_size)
        return bounds[self.rank], bounds[self.rank + 1]

    def rows_held(self, vocab: int) -> int:
        return vocab

    def owner(self, ids: tf.Tensor) -> tf.Tensor:
        return tf.fill(tf.shape(ids), tf.constant(self.rank, tf.int32))

    def owns(self, ids: tf.Tensor) -> tf.Tensor:
        return tf.ones_like(ids, dtype=tf.bool)

    def local_row(self, ids: tf.Tensor) -> tf.Tensor:
        return ids

    def global_row(self, local_rows: tf.Tensor) -> tf.Tensor:
        return local_rows

    def local_part(self, full: Any) -> Any:
        """This rank's columns of a whole logical table (a numpy array or a tensor)."""
        lo, hi = self.columns()
        return full[:, lo:hi]

    def stride(self) -> Tuple[int, int]:
        return (0, 1)
