"""The exchange of a ``column_wise`` table: every rank holds a slice of every row's dims.

Route: one allgather of every rank's ids (and one of their counts). Look
up: each rank gathers its slice of every id. Return: one alltoall hands
each rank the slices of its own ids from every rank, which it joins along
the dims. Slices of uneven width travel padded to the widest (the first
``dim % N`` ranks hold one column more). Backwards, the gradient retraces
the alltoall, so each rank's local variable receives the gradient of its
columns of every id the step looked up, as ``IndexedSlices``.

Both backends (``hb``, ``sok``) serve column-wise groups with it; ``hb``
sends the distinct ids of each lookup only (:mod:`.hb`).
"""

from __future__ import annotations

from typing import List, Sequence

import tensorflow as tf

from collective import comm
from collective.embedding.exchanges.base import Prepared, rows_of_keys, split_by_request, tagged_keys
from collective.sharding.layouts.column_wise import column_bounds


def fetch_slices(group: Sequence[Prepared], ids: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """One whole vector per id of ``ids`` (one int64 vector per request of ``group``, whose tables share one
    width), joined from every rank's slice of it."""
    info = group[0].info
    n, dim = info.world_size, info.dim
    bounds = column_bounds(dim, n)
    widest = max(bounds[r + 1] - bounds[r] for r in range(n))
    keys = tagged_keys(ids)
    count = tf.size(keys, out_type=tf.int32)
    counts = comm.allgather(tf.reshape(count, [1]))
    slices = rows_of_keys(group, comm.allgather(keys))
    padded = tf.pad(slices, [[0, 0], [0, widest - info.local_dim]])
    received, _ = comm.alltoall(padded, counts)
    by_rank = tf.reshape(received, [n, count, widest])
    vectors = tf.concat([by_rank[r, :, :bounds[r + 1] - bounds[r]] for r in range(n)], axis=1)
    vectors.set_shape([None, dim])
    return split_by_request(vectors, ids)
