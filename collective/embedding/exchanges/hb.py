"""``hb``, after HybridBackend: deduplicate, one alltoall of ids, gather, one alltoall of vectors.

All the group's lookups of tables with one width and dtype, plain and
combined alike, share the two alltoalls; the ids are deduplicated over the
whole group, and combiners run on the rank that asked.
"""

from __future__ import annotations

from typing import List

import tensorflow as tf

from collective.embedding.exchanges.base import Exchange, Prepared, fetch_from_owners, finish


class HbExchange(Exchange):
    """HybridBackend's exchange."""

    name = "hb"

    def exchange(self, group: List[Prepared]) -> List[tf.Tensor]:
        return [finish(p, v) for p, v in zip(group, fetch_from_owners(group, dedup=True))]
