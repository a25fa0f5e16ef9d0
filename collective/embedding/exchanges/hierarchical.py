"""Row lookups that cross hosts once per owning host: within the host first, then across, as TorchRec's 2D
sharding does. Used by ``hb`` in place of :func:`~.base.fetch_from_owners` when :func:`route` gives this job's hosts (it spans
several and the planner says the route pays); the tables' layouts do not change.

Each id goes first to the worker of its own host that relays for the owner (the owner's local rank modulo the
host's size: every id of one owner meets on one rank of each host), one all-to-all within the host. The relay
merges the ids its host's workers asked for (one per distinct id) and sends each to its owner: the only step
that crosses hosts, one message per owning rank with each id once per host. The vectors come back the same way,
and the gradients go back the reverse way, summed over the workers of a host that asked for one id.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from collective import comm
from collective.embedding.exchanges.base import (Prepared, by_destination, distinct, rows_of_keys, split_by_request,
                                                 tagged_keys)
from collective.sharding import planner


def route() -> Optional[comm.HostGroup]:
    """This worker's host when row lookups cross hosts through relays (:func:`fetch_through_hosts`), else None:
    one host, ``COLLECTIVE_HIERARCHICAL=0``, or hosts where ``planner.hierarchical_pays`` says it does not pay."""
    host = comm.host_group()
    if host is None or not planner.hierarchical_pays([len(ranks) for ranks in host.hosts.hosts]):
        return None
    return host


def fetch_through_hosts(group: Sequence[Prepared], ids: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """One vector per id of ``ids`` (one int64 vector per request of ``group``), from the ranks that hold them,
    through this host's relays (see the module docstring)."""
    host = route()
    n, count = group[0].info.world_size, len(group)
    layout = group[0].info.layout

    def owner(keys: tf.Tensor) -> tf.Tensor:
        return layout.owner(keys // count if count > 1 else keys)

    keys = tagged_keys(ids)
    # Each host's relays differ: a constant Grappler must not fold (comm.rank_tensor's reason).
    relays = comm._unfoldable(  # pylint: disable=protected-access
        tf.constant(np.array(host.hosts.relays(comm.rank()), np.int32)))
    sent, order, splits = by_destination(keys, tf.gather(relays, owner(keys)), len(host.ranks))
    relayed, relayed_splits = comm.alltoall(sent, splits, within_host=True)

    merged, index = distinct(relayed)
    crossing, cross_order, cross_splits = by_destination(merged, owner(merged), n)
    received, received_splits = comm.alltoall(crossing, cross_splits)
    returned, _ = comm.alltoall(rows_of_keys(group, received), received_splits)

    merged_vectors = tf.gather(returned, tf.math.invert_permutation(cross_order))
    back, _ = comm.alltoall(tf.gather(merged_vectors, index), relayed_splits, within_host=True)
    return split_by_request(tf.gather(back, tf.math.invert_permutation(order)), ids)
