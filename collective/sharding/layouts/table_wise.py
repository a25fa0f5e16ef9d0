"""The ``table_wise`` layout: the whole table on one rank (``holder``), at its own row numbers.

Every id is owned by ``holder`` at local row ``id``; the other ranks hold
no rows (a ``[0, dim]`` variable), so the exchanges route every id there
and the checkpoint's alltoall sends each stored block from there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import tensorflow as tf

# ``stride()`` of a rank holding nothing: a first row before row 0 and a step past any table, so no logical row
# is ever one of its rows.
_NONE_HELD = (-1, 1 << 62)


@dataclasses.dataclass(frozen=True)
class TableWiseLayout:
    """Rank ``rank`` of ``world_size``'s view of a table held whole by rank ``holder``."""

    rank: int
    world_size: int
    holder: int

    replicated = False

    @property
    def sharded(self) -> bool:
        """Rows are not on every rank (with one worker, the one rank holds them all)."""
        return self.world_size > 1

    @property
    def holds(self) -> bool:
        return self.rank == self.holder

    def rows_held(self, vocab: int) -> int:
        return vocab if self.holds else 0

    def owner(self, ids: tf.Tensor) -> tf.Tensor:
        return tf.fill(tf.shape(ids), tf.constant(self.holder, tf.int32))

    def owns(self, ids: tf.Tensor) -> tf.Tensor:
        return tf.fill(tf.shape(ids), tf.constant(self.holds))

    def local_row(self, ids: tf.Tensor) -> tf.Tensor:
        return ids

    def global_row(self, local_rows: tf.Tensor) -> tf.Tensor:
        return local_rows

    def local_part(self, full: Any) -> Any:
        return full if self.holds else full[:0]

    def stride(self) -> Tuple[int, int]:
        return (0, 1) if self.holds else _NONE_HELD
