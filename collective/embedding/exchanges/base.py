"""The protocol every exchange implements, and the pieces they share.

A lookup on a sharded table is a :class:`Request`: plain (``embedding_lookup``:
one vector per id) or combined (``embedding_lookup_sparse``: one combined
vector per segment). The dispatcher (:func:`collective.embedding.lookup.run`)
checks and flattens each request (:func:`prepare`), serves world size 1 and
tables held whole locally, and hands the rest to the table's exchange in
groups of requests with the same :meth:`Exchange.group_key`: one group is one
exchange on the wire, and a single lookup is a group of one.

An exchange does three steps for its group, each a TensorFlow op, so the
gradient path is the reverse of the forward one and reaches each table's
local variable as ``IndexedSlices``:

1. route: send each id to the rank that holds its row (``ShardLayout.owner``);
2. look up: gather the rows this rank holds (:func:`owned_rows`);
3. return: send the vectors (or per-sample partial sums) back to the rank
   that asked, and combine there if the exchange did not.

Bytes cross the wire only inside ``collective.comm`` calls, which count them.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Hashable, List, Optional, Sequence, Tuple

import tensorflow as tf

from collective import comm
from collective.embedding import combiners
from collective.embedding.packed_group import PackedTable
from collective.embedding.table import ShardInfo


@dataclasses.dataclass
class Request:
    """One lookup of a sharded table.

    ``combiner`` None makes it plain (``ids`` of any shape, result
    ``ids.shape + [dim]``); otherwise ``combiner`` over ``table[ids] * weights``
    per segment, result ``[num_segments, dim]`` (default ``max(segments) + 1``,
    as TensorFlow's lookup).
    """

    table: tf.Variable
    info: ShardInfo
    ids: tf.Tensor
    segments: Optional[tf.Tensor] = None
    weights: Optional[tf.Tensor] = None
    combiner: Optional[str] = None
    num_segments: Optional[tf.Tensor] = None
    # Whether ``segments`` ascend, as TensorFlow's own lookups require of theirs (a SparseTensor in canonical
    # order, a ragged tensor's rows): such unweighted lookups combine as TensorFlow does, with the sorted
    # ``tf.sparse.segment_*`` over one vector per distinct id.
    sorted_segments: bool = False

    @property
    def plain(self) -> bool:
        return self.combiner is None


@dataclasses.dataclass
class Prepared:
    """A request checked and flattened for the wire."""

    req: Request
    ids: tf.Tensor                           # 1-D int64, checked against the table's vocabulary
    segments: Optional[tf.Tensor] = None     # int64, combined requests only
    weights: Optional[tf.Tensor] = None      # the table's dtype; None: every weight is 1
    num_segments: Optional[tf.Tensor] = None  # int64 scalar, combined requests only

    @property
    def weighted(self) -> bool:
        """Whether the caller gave weights (they may need a gradient)."""
        return self.weights is not None

    @property
    def info(self) -> ShardInfo:
        return self.req.info

    @property
    def combines_distinct(self) -> bool:
        """Whether the result is combined from one vector per distinct id, as TensorFlow's lookup combines it
        (unweighted, segments ascending)."""
        return not self.req.plain and not self.weighted and self.req.sorted_segments

    @property
    def dtype(self) -> tf.DType:
        return self.req.table.dtype.base_dtype


def checked_ids(ids: tf.Tensor, info: ShardInfo) -> tf.Tensor:
    """``ids`` as int64, with an assertion that names the table when one is out of range.

    Hash-table vocabularies take every int64 key: nothing to check. The
    check is the two reductions whose values the error reports (the
    batch's smallest and largest id, one of them offending); it is a plain
    ``Assert`` op, with no ``tf.cond`` to build per lookup.
    """
    ids = tf.cast(ids, tf.int64)
    if info.hash_index is not None:
        return ids
    smallest, largest = tf.reduce_min(ids), tf.reduce_max(ids)
    valid = tf.logical_and(smallest >= 0, largest < info.vocab)
    check = tf.raw_ops.Assert(condition=valid, data=[
        f"embedding table {info.name} has {info.vocab} rows but got ids outside [0, {info.vocab}): fix the feature "
        "that feeds it (negative ids or ids >= the vocabulary size), or hash or clip the ids before the lookup. "
        f"{OUT_OF_RANGE_EXTREMES}", smallest, largest], summarize=10)
    with tf.control_dependencies([check]):
        return tf.identity(ids)


OUT_OF_RANGE_EXTREMES = "Smallest and largest id of the batch:"


def prepare(req: Request) -> Prepared:
    """Checks ``req`` and brings its tensors to the wire's dtypes."""
    if req.plain:
        return Prepared(req, checked_ids(tf.reshape(req.ids, [-1]), req.info))
    combiners.check_combiner(req.combiner, req.info.name)
    ids = checked_ids(req.ids, req.info)
    segments = tf.cast(req.segments, tf.int64)
    dtype = req.table.dtype.base_dtype
    weights = None if req.weights is None else tf.cast(req.weights, dtype)
    if req.num_segments is None:
        num_segments = tf.reduce_max(tf.concat([segments, [-1]], axis=0)) + 1
    else:
        num_segments = tf.cast(req.num_segments, tf.int64)
    return Prepared(req, ids, segments, weights, num_segments)


def owned_rows(p: Prepared, ids: tf.Tensor) -> tf.Tensor:
    """Vectors of int64 ``ids`` that this rank holds, read from ``p``'s local table."""
    index = p.info.hash_index
    if index is not None:
        rows = index.owned_vectors(p.req.table, ids)
    elif isinstance(p.req.table, PackedTable):
        rows = tf.gather(p.req.table.group.variable, p.req.table.group_ids(p.info.layout.local_row(ids)))
    else:
        rows = tf.gather(p.req.table, p.info.layout.local_row(ids))
    return scale_gradient(rows, p.info.gradient_scale)


def scale_gradient(x: tf.Tensor, scale: float) -> tf.Tensor:
    """``x`` forward; its gradient times ``scale`` backward (the table's loss contract, ``ShardInfo.gradient_scale``)."""
    if scale == 1.0:
        return x

    @tf.custom_gradient
    def scaled(value):
        def grad(upstream):
            if isinstance(upstream, tf.IndexedSlices):
                return tf.IndexedSlices(upstream.values * scale, upstream.indices, upstream.dense_shape)
            return upstream * scale

        return tf.identity(value), grad

    return scaled(x)


def distinct(ids: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(distinct ids in first-seen order, each id's int32 position among them)``.

    ``UniqueWithCounts``, not ``Unique``: Grappler's ``SimplifyEmbeddingLookupStage`` rewrites ``Unique``
    feeding a gather of a variable and a ``SparseSegmentSum`` into a read of the whole table every step
    (docs/benchmarks.md); the op it does not know keeps the gather of the distinct rows.
    """
    found = tf.unique_with_counts(ids, out_idx=tf.int32)
    return found.y, found.idx


def finish(p: Prepared, vectors: tf.Tensor) -> tf.Tensor:
    """The request's result from one vector per id: combined per segment, or reshaped like its ids."""
    if not p.req.plain:
        combined = combiners.combine(vectors, p.weights, p.segments, p.num_segments, p.req.combiner)
        combined.set_shape([None, p.info.dim])  # a collective's output has no static shape: Dense layers need it
        return combined
    ids = tf.convert_to_tensor(p.req.ids)
    out = tf.reshape(vectors, tf.concat([tf.shape(ids), [p.info.dim]], axis=0))
    out.set_shape(ids.shape.concatenate([p.info.dim]))
    return out


def finish_distinct(p: Prepared, vectors: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """The request's result from one vector per distinct id (``index``: each id's position, :func:`distinct`).

    Lookups that :attr:`Prepared.combines_distinct` combine the distinct vectors directly with the sorted
    segment reduction, as ``tf.nn.embedding_lookup_sparse`` does; the rest expand them to one per id first.
    """
    if not p.combines_distinct:
        return finish(p, tf.gather(vectors, index))
    combined = combiners.combine_sorted(vectors, index, p.segments, p.num_segments, p.req.combiner)
    combined.set_shape([None, p.info.dim])
    return combined


def serve_locally(p: Prepared) -> tf.Tensor:
    """The request's result from this rank's table alone (world size 1), with TensorFlow's own op structure:
    one gather per distinct id for lookups that combine them, one per id otherwise."""
    if p.combines_distinct:
        ids, index = distinct(p.ids)
        return finish_distinct(p, owned_rows(p, ids), index)
    return finish(p, owned_rows(p, p.ids))


def tagged_keys(ids: Sequence[tf.Tensor]) -> tf.Tensor:
    """Every request's ids (one int64 vector per request of a group) in one vector as ``id * T + t``
    (``t`` the request's index, ``T`` the count).

    Requests of hash-table vocabularies (any int64 key) travel in groups of one, where this is ``id``.
    """
    count = len(ids)
    if count == 1:
        return ids[0]
    return tf.concat([request_ids * count + t for t, request_ids in enumerate(ids)], axis=0)


def rows_of_keys(group: Sequence[Prepared], keys: tf.Tensor) -> tf.Tensor:
    """Rows this rank holds for :func:`tagged_keys` of ``group``, in the order of ``keys``."""
    count = len(group)
    if count == 1:
        return owned_rows(group[0], keys)
    which = tf.cast(keys % count, tf.int32)
    if _one_group(group):
        tables = [p.req.table for p in group]
        offsets = tf.constant([t.sealed_offset() for t in tables], dtype=tf.int64)
        rows = tf.gather(tables[0].group.variable,
                         tf.gather(offsets, which) + group[0].info.layout.local_row(keys // count))
        return scale_gradient(rows, group[0].info.gradient_scale)
    positions = tf.dynamic_partition(tf.range(tf.size(keys, out_type=tf.int32)), which, count)
    ids = tf.dynamic_partition(keys // count, which, count)
    return tf.dynamic_stitch(positions, [owned_rows(p, i) for p, i in zip(group, ids)])


def _one_group(group: Sequence[Prepared]) -> bool:
    """Whether every request of ``group`` looks up a packed table of one packing group (one gather serves them)."""
    tables = [p.req.table for p in group]
    return (all(isinstance(t, PackedTable) for t in tables) and len({id(t.group) for t in tables}) == 1
            and len({p.info.gradient_scale for p in group}) == 1)


def split_by_request(vectors: tf.Tensor, ids: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """``vectors`` (one per key of :func:`tagged_keys` of ``ids``) cut back into one tensor per request."""
    if len(ids) == 1:
        return [vectors]
    sizes = tf.stack([tf.size(request_ids) for request_ids in ids])
    return tf.split(vectors, sizes, num=len(ids))


def by_destination(keys: tf.Tensor, destination: tf.Tensor, n: int) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``keys`` sorted stably by ``destination`` (int32 in ``[0, n)``: destinations in order, each one's keys in
    their own order), the order taken, and the count per destination: an alltoall's payload and splits."""
    order = tf.concat(tf.dynamic_partition(tf.range(tf.size(keys, out_type=tf.int32)), destination, n), axis=0)
    return tf.gather(keys, order), order, tf.math.bincount(destination, minlength=n, maxlength=n, dtype=tf.int32)


def fetch_from_owners(group: Sequence[Prepared], ids: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """One vector per id of ``ids`` (one int64 vector per request of ``group``), from the ranks that hold them
    (:func:`fetch_keys`)."""
    return split_by_request(fetch_keys(group, tagged_keys(ids)), ids)


def fetch_keys(group: Sequence[Prepared], keys: tf.Tensor) -> tf.Tensor:
    """One vector per key of ``keys`` (:func:`tagged_keys` of ``group``), from the ranks that hold them.

    Route: keys bucketed by owner, one alltoall. Look up: each owner gathers its rows. Return: one alltoall
    of vectors, back in order.
    """
    n = group[0].info.world_size
    owner = group[0].info.layout.owner(keys // len(group) if len(group) > 1 else keys)
    sent, order, splits = by_destination(keys, owner, n)
    received, received_splits = comm.alltoall(sent, splits)
    returned, _ = comm.alltoall(rows_of_keys(group, received), received_splits)
    return tf.gather(returned, tf.math.invert_permutation(order))


class Exchange(abc.ABC):
    """One backend's way of serving a group of lookups across ranks (see the module docstring)."""

    name: ClassVar[str]

    def group_key(self, p: Prepared) -> Hashable:
        """Requests with equal keys share one exchange. Default: same dtype, width and layout (a table-wise
        table's rank, column-wise or not: one group routes by one layout); hash tables alone."""
        alone = id(p.req.table) if p.info.hash_index is not None else None
        return (p.dtype, p.info.dim, alone, p.info.holder, p.info.column_wise)

    @abc.abstractmethod
    def exchange(self, group: List[Prepared]) -> List[tf.Tensor]:
        """Each request's result (see :func:`finish`) for one group, on world size > 1."""
