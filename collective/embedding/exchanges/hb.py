"""``hb``, after HybridBackend: deduplicate, one alltoall of ids, gather, one alltoall of vectors.

All the group's lookups of tables with one width and dtype, plain and
combined alike, share the two alltoalls. Each lookup's ids are
deduplicated (tagged by lookup, so the group's keys are distinct), only the
distinct rows cross the wire and are gathered, and combiners run on the
rank that asked: over the distinct vectors with TensorFlow's sorted
segment reduction where TensorFlow's lookup does so. Column-wise tables
send the same distinct ids through :mod:`.column_wise` instead, and on
several hosts row lookups cross hosts once per host (:mod:`.hierarchical`).
"""

from __future__ import annotations

from typing import List

import tensorflow as tf

from collective.embedding import packing
from collective.embedding.exchanges.base import (Exchange, Prepared, distinct, fetch_from_owners, fetch_keys,
                                                 finish_distinct)
from collective.embedding.exchanges import hierarchical
from collective.embedding.exchanges.column_wise import fetch_slices


class HbExchange(Exchange):
    """HybridBackend's exchange."""

    name = "hb"

    def exchange(self, group: List[Prepared]) -> List[tf.Tensor]:
        if packing.enabled() and not group[0].info.column_wise:
            return packing.serve_groups(group, self._unpacked, fetch_keys)
        return self._unpacked(group)

    def _unpacked(self, group: List[Prepared]) -> List[tf.Tensor]:
        found = [distinct(p.ids) for p in group]
        if group[0].info.column_wise:
            fetch = fetch_slices
        else:
            fetch = hierarchical.fetch_through_hosts if hierarchical.route() is not None else fetch_from_owners
        vectors = fetch(group, [ids for ids, _ in found])
        return [finish_distinct(p, v, index) for p, v, (_, index) in zip(group, vectors, found)]
