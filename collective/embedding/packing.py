"""Lookup-side packing (issue 44, stage 1; docs/packing.md): one unique and one combine per group of lookups.

With ``COLLECTIVE_PACKING=1`` (off by default), the combined lookups of one
exchange group (same dtype, width and layout, see
:meth:`~collective.embedding.exchanges.base.Exchange.group_key`) that combine
one vector per distinct id with the same combiner (:func:`packable`) are
served together: their ids tagged by request (:func:`~.exchanges.base.tagged_keys`)
go through one ``UniqueWithCounts``, the distinct rows are fetched once
(``fetch``: this rank's tables at world size 1, the owners' beyond), and one
sorted segment reduction combines every request, its segments offset by
the requests before it, before the result is split back per request.

Every table keeps its own variable: the gradient reaches each one as the
same ``IndexedSlices`` of its distinct rows, and the results equal the
unpacked ones (the same rows summed in the same order per segment).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Hashable, Iterator, List, Sequence, Tuple

import tensorflow as tf

from collective import context
from collective.embedding import combiners
from collective.embedding.exchanges.base import Prepared, distinct, tagged_keys

Fetch = Callable[[Sequence[Prepared], tf.Tensor], tf.Tensor]
_local = threading.local()


def enabled() -> bool:
    """Whether lookups built now pack: the innermost :func:`using` block's choice, else ``COLLECTIVE_PACKING``."""
    chosen = getattr(_local, "on", None)
    return context.get().packing if chosen is None else chosen


@contextlib.contextmanager
def using(on: bool) -> Iterator[None]:
    """Lookups built in the block pack (or not) whatever ``COLLECTIVE_PACKING`` says."""
    previous = getattr(_local, "on", None)
    _local.on = bool(on)
    try:
        yield
    finally:
        _local.on = previous


def packable(p: Prepared) -> bool:
    """Whether ``p`` can share a packed lookup: combined over distinct ids (unweighted, segments ascending),
    a fixed vocabulary, not column-wise."""
    return p.combines_distinct and p.info.hash_index is None and not p.info.column_wise


def split(group: Sequence[Prepared]) -> Tuple[List[List[int]], List[int]]:
    """``(packs, rest)``: positions in ``group`` of each pack of two or more :func:`packable` requests with one
    combiner, and of every other request (served one by one)."""
    by_combiner: Dict[Hashable, List[int]] = {}
    rest = []
    for i, p in enumerate(group):
        if packable(p):
            by_combiner.setdefault(p.req.combiner, []).append(i)
        else:
            rest.append(i)
    packs = [indices for indices in by_combiner.values() if len(indices) > 1]
    rest += [indices[0] for indices in by_combiner.values() if len(indices) == 1]
    return packs, sorted(rest)


def serve(group: Sequence[Prepared], fetch: Fetch) -> List[tf.Tensor]:
    """Each request's combined vectors, for a pack of :func:`split`: one unique, one ``fetch`` of the distinct
    tagged keys (one vector per key, in their order), one sorted segment reduction."""
    keys, index = distinct(tagged_keys([p.ids for p in group]))
    vectors = fetch(group, keys)
    counts = tf.stack([p.num_segments for p in group])
    offsets = tf.cumsum(counts, exclusive=True)
    segments = tf.concat([p.segments + offsets[t] for t, p in enumerate(group)], axis=0)
    combined = combiners.combine_sorted(vectors, index, segments, tf.reduce_sum(counts), group[0].req.combiner)
    outputs = tf.split(combined, counts, num=len(group))
    for out, p in zip(outputs, group):
        out.set_shape([None, p.info.dim])
    return outputs


def serve_groups(group: Sequence[Prepared], serve_one: Callable[[Sequence[Prepared]], List[tf.Tensor]],
                 fetch: Fetch) -> List[tf.Tensor]:
    """Each request's result for ``group``: the packs of :func:`split` through :func:`serve`, the rest through
    ``serve_one`` (the unpacked path, given the requests it serves)."""
    outputs: List[tf.Tensor] = [None] * len(group)  # type: ignore[list-item]
    packs, rest = split(group)
    for pack in packs:
        for i, out in zip(pack, serve([group[i] for i in pack], fetch)):
            outputs[i] = out
    if rest:
        for i, out in zip(rest, serve_one([group[i] for i in rest])):
            outputs[i] = out
    return outputs
