"""``replicated``: plain data parallelism for tables, as Horovod users run it.

Every rank holds the whole table (``ShardLayout(replicated=True)``). Route:
one allgather of every rank's ids, so that each rank's copy sees every id
the step touches. Look up: a local gather of all of them. Return: each rank
keeps its own rows; backwards, the vectors' gradients are allgathered, so
every copy receives every rank's sparse gradient and all copies stay equal.
"""

from __future__ import annotations

from typing import List

import tensorflow as tf

from collective import comm
from collective.embedding.exchanges.base import Exchange, Prepared, finish, rows_of_keys, split_by_request, \
    tagged_keys


class ReplicatedExchange(Exchange):
    """Data parallelism for tables: allgathered ids forward, allgathered sparse gradients backward."""

    name = "replicated"

    def exchange(self, group: List[Prepared]) -> List[tf.Tensor]:
        ids = [p.ids for p in group]
        keys = tagged_keys(ids)
        count = tf.size(keys, out_type=tf.int64)
        start = tf.reduce_sum(comm.allgather(tf.reshape(count, [1]))[:comm.rank_tensor()])
        every_rank = rows_of_keys(group, comm.allgather(keys))

        @tf.custom_gradient
        def own_rows(rows):
            def grad(upstream):
                return comm.allgather(upstream)

            return tf.slice(rows, [start, 0], [count, -1]), grad

        return [finish(p, v) for p, v in zip(group, split_by_request(own_rows(every_rank), ids))]
