"""Where the rows of a logical ``[vocab, dim]`` table live: the one place that knows.

Two layouts:

- sharded (``hb``, ``sok``, hash tables): row ``i`` lives on rank
  ``i % N`` at local row ``i // N``; rank ``r`` holds ``rows_held(vocab)``
  rows. Negative keys of hash tables follow ``floormod``, as TensorFlow's
  ``%`` on tensors does.
- replicated (``replicated`` backend, small tables): every rank holds every
  row at its own index.

Every piece of code that maps ids to owners or local rows (the exchanges,
initial values, hash tables, checkpoints, export) asks a :class:`ShardLayout`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Rank ``rank`` of ``world_size``'s view of one table's rows."""

    rank: int
    world_size: int
    replicated: bool = False

    @property
    def sharded(self) -> bool:
        """Whether rows are spread over more than one worker."""
        return self.world_size > 1 and not self.replicated

    def rows_held(self, vocab: int) -> int:
        """How many of rows ``0..vocab-1`` this rank holds."""
        if not self.sharded:
            return vocab
        return max(0, (vocab - self.rank + self.world_size - 1) // self.world_size)

    def owner(self, ids: tf.Tensor) -> tf.Tensor:
        """The rank holding each int64 id (int32); this rank's own for a replicated table."""
        if not self.sharded:
            return tf.fill(tf.shape(ids), tf.constant(self.rank, tf.int32))
        return tf.cast(tf.math.floormod(ids, self.world_size), tf.int32)

    def owns(self, ids: tf.Tensor) -> tf.Tensor:
        """Whether this rank holds each int64 id."""
        if not self.sharded:
            return tf.ones_like(ids, dtype=tf.bool)
        return tf.equal(tf.math.floormod(ids, self.world_size), self.rank)

    def local_row(self, ids: tf.Tensor) -> tf.Tensor:
        """The local row of each id on its owner."""
        return ids // self.world_size if self.sharded else ids

    def global_row(self, local_rows: tf.Tensor) -> tf.Tensor:
        """The logical row of each of this rank's local rows."""
        return local_rows * self.world_size + self.rank if self.sharded else local_rows

    def local_part(self, full: Any) -> Any:
        """This rank's rows of a whole logical table (a numpy array or a tensor)."""
        return full[self.rank::self.world_size] if self.sharded else full

    def stride(self) -> Tuple[int, int]:
        """``(first, step)``: this rank holds logical rows ``first, first + step, ...``."""
        return (self.rank, self.world_size) if self.sharded else (0, 1)


def positions_in_block(lo: tf.Tensor, hi: tf.Tensor, first, step) -> tf.Tensor:
    """Positions within the logical block ``[lo, hi)`` of rows ``first, first + step, ...`` (int64; the
    arguments may be tensors). Empty when the block holds none of them (a block shorter than ``step``)."""
    size = hi - lo
    start = tf.minimum(tf.math.floormod(tf.cast(first, tf.int64) - lo, tf.cast(step, tf.int64)), size)
    return tf.range(start, size, step, dtype=tf.int64)
