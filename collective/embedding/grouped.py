"""Coalesced lookups: several sharded tables' combined lookups in one exchange.

Each table keeps its own ``id % N`` sharding; only the wire is shared.

- ``hb``: per group of tables with the same dimension and dtype, the ids of
  all tables travel in one alltoall as ``local_row * T + t`` (``t`` the
  table's index in the group, ``T`` the group's size), after one ``unique``
  over ``id * T + t``; each owner gathers every table's rows and sends them
  back in one alltoall of vectors. The combiner runs per table on the
  worker that asked.
- ``sok``: SOK's fused ``DistributedEmbedding``: one allgather carries every
  table's ids with their sample index, table index and weight; each worker
  gathers and combines the rows it owns per sample and table, and one
  reduce-scatter of ``[samples, sum of dims]`` returns every table's vectors
  to the sample's worker. Tables of any dimension share it (per dtype).

Tables that are not sharded, hash-table vocabularies and world size 1 take
the per-table path (:mod:`collective.embedding.exchange`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from collective import comm, context
from collective.embedding import exchange
from collective.embedding.table import ShardInfo, shard_of


@dataclasses.dataclass
class Request:
    """One combined lookup: ``combiner`` over ``table[ids] * weights`` per segment (sample)."""

    table: tf.Variable
    info: ShardInfo
    ids: tf.Tensor
    segments: tf.Tensor
    weights: Optional[tf.Tensor]
    combiner: str
    # Rows of the result; default ``max(segments) + 1`` as TensorFlow's lookup.
    num_segments: Optional[tf.Tensor] = None


def lookup_sparse_group(tables: Sequence[tf.Variable], sp_ids_list: Sequence[tf.SparseTensor],
                        sp_weights_list: Optional[Sequence[Optional[tf.SparseTensor]]] = None,
                        combiners: Optional[Sequence[str]] = None, backend: Optional[str] = None,
                        name: Optional[str] = None, pad_to_batch: bool = False) -> List[tf.Tensor]:
    """``tf.nn.embedding_lookup_sparse`` of several tables with one exchange per group.

    Args:
      tables: one variable per lookup; sharded tables (made in
        ``embedding_scope()``) are coalesced, others use TensorFlow's lookup.
      sp_ids_list: ``SparseTensor`` of ids per table (rows are samples).
      sp_weights_list: optional ``SparseTensor`` of weights per table (or None entries).
      combiners: ``sum``, ``mean`` or ``sqrtn`` per table (default ``mean``).
      backend: ``hb`` or ``sok`` (default: the strategy's backend).
      name: name scope of the ops.
      pad_to_batch: give every result ``sp_ids.dense_shape[0]`` rows (zeros
        for samples without ids), as DeepRec's ``group_embedding_lookup_sparse``.

    Returns:
      One ``[max(row) + 1, dim]`` tensor per table, as ``tf.nn.embedding_lookup_sparse`` gives
      (``[batch, dim]`` with ``pad_to_batch``).
    """
    count = len(tables)
    sp_weights_list = list(sp_weights_list) if sp_weights_list is not None else [None] * count
    combiners = list(combiners) if combiners is not None else ["mean"] * count
    if not len(sp_ids_list) == len(sp_weights_list) == len(combiners) == count:
        raise ValueError(f"lookup_sparse_group got {count} tables, {len(sp_ids_list)} id tensors, "
                         f"{len(sp_weights_list)} weight tensors and {len(combiners)} combiners; give one of each "
                         "per table")
    outputs: List[Optional[tf.Tensor]] = [None] * count
    requests, at = [], []
    with tf.name_scope(name or "lookup_sparse_group"):
        for i, (table, sp_ids, sp_weights, combiner) in enumerate(zip(tables, sp_ids_list, sp_weights_list,
                                                                      combiners)):
            info = shard_of(table)
            rows = sp_ids.dense_shape[0] if pad_to_batch else None
            if info is None:
                outputs[i] = _padded(tf.nn.embedding_lookup_sparse(table, sp_ids, sp_weights, combiner=combiner),
                                     rows)
                continue
            requests.append(Request(table, info, sp_ids.values, sp_ids.indices[:, 0],
                                    None if sp_weights is None else sp_weights.values, combiner, rows))
            at.append(i)
        for i, out in zip(at, combine_group(requests, backend)):
            outputs[i] = out
    return outputs


def combine_group(requests: Sequence[Request], backend: Optional[str] = None) -> List[tf.Tensor]:
    """Combined vectors for each request, coalescing the exchanges; same results as one lookup each."""
    backend = backend or context.get().backend
    outputs: List[Optional[tf.Tensor]] = [None] * len(requests)
    grouped: Dict[Tuple, List[int]] = {}
    for i, req in enumerate(requests):
        if req.combiner not in exchange.COMBINERS:
            raise ValueError(f"combiner {req.combiner!r} for table '{req.info.name}' is not one of "
                             f"{', '.join(exchange.COMBINERS)}")
        if req.info.world_size == 1 or req.info.hash_index is not None:
            outputs[i] = _padded(exchange.lookup_sparse(req.table, req.info, req.ids, req.segments, req.weights,
                                                        req.combiner, backend), req.num_segments)
            continue
        key = (req.table.dtype.base_dtype,) if backend == "sok" else (req.table.dtype.base_dtype, req.info.dim)
        grouped.setdefault(key, []).append(i)
    for indices in grouped.values():
        prepared = [_prepare(requests[i]) for i in indices]
        run = _sok_group if backend == "sok" else _hb_group
        for i, out in zip(indices, run(prepared)):
            outputs[i] = out
    return outputs


@dataclasses.dataclass
class _Prepared:
    req: Request
    ids: tf.Tensor          # int64, checked against the table's vocabulary
    segments: tf.Tensor     # int64
    weights: tf.Tensor      # the table's dtype
    num_segments: tf.Tensor  # int64 scalar


def _prepare(req: Request) -> _Prepared:
    ids = exchange.checked_ids(req.ids, req.info)
    segments = tf.cast(req.segments, tf.int64)
    dtype = req.table.dtype.base_dtype
    weights = tf.ones_like(ids, dtype=dtype) if req.weights is None else tf.cast(req.weights, dtype)
    if req.num_segments is None:
        num_segments = tf.reduce_max(tf.concat([segments, [-1]], axis=0)) + 1
    else:
        num_segments = tf.cast(req.num_segments, tf.int64)
    return _Prepared(req, ids, segments, weights, num_segments)


def _padded(vectors: tf.Tensor, rows: Optional[tf.Tensor]) -> tf.Tensor:
    """``vectors`` with zero rows appended up to ``rows`` (unchanged when ``rows`` is None)."""
    if rows is None:
        return vectors
    missing = tf.cast(rows, tf.int32) - tf.shape(vectors)[0]
    return tf.pad(vectors, [[0, tf.maximum(missing, 0)], [0, 0]])


def _combine(vectors, p: _Prepared) -> tf.Tensor:
    combined = tf.math.unsorted_segment_sum(vectors * p.weights[:, None], p.segments, p.num_segments)
    norm = exchange._normaliser(p.weights, p.segments, p.num_segments, p.req.combiner)  # pylint: disable=protected-access
    return combined if norm is None else combined / norm[:, None]


def _hb_group(prepared: List[_Prepared]) -> List[tf.Tensor]:
    """One id alltoall and one vector alltoall for tables of one dimension."""
    n = prepared[0].req.info.world_size
    count = len(prepared)
    keys = tf.concat([p.ids * count + t for t, p in enumerate(prepared)], axis=0)
    unique, index = tf.unique(keys, out_idx=tf.int32)
    ids, which = unique // count, unique % count
    owner = tf.cast(ids % n, tf.int32)
    order = tf.argsort(owner, stable=True)
    splits = tf.math.bincount(owner, minlength=n, maxlength=n, dtype=tf.int32)
    sent = tf.gather((ids // n) * count + which, order)
    received, received_splits = comm.alltoall(sent, splits)
    rows, tables = received // count, tf.cast(received % count, tf.int32)
    positions, parts = [], []
    for t, p in enumerate(prepared):
        at = tf.cast(tf.reshape(tf.where(tf.equal(tables, t)), [-1]), tf.int32)
        positions.append(at)
        parts.append(tf.gather(p.req.table, tf.gather(rows, at)))
    vectors = tf.dynamic_stitch(positions, parts)
    returned, _ = comm.alltoall(vectors, received_splits)
    per_key = tf.gather(tf.gather(returned, tf.math.invert_permutation(order)), index)
    sizes = tf.stack([tf.size(p.ids) for p in prepared])
    return [_combine(v, p) for v, p in zip(tf.split(per_key, sizes, num=count), prepared)]


def _sok_group(prepared: List[_Prepared]) -> List[tf.Tensor]:
    """One allgather of (id, sample, table, weight), local combine, one reduce-scatter for all tables."""
    info = prepared[0].req.info
    n, r = info.world_size, info.rank
    dtype = prepared[0].req.table.dtype.base_dtype
    block = tf.reduce_max(comm.allgather(tf.reshape(tf.reduce_max(tf.stack([p.num_segments for p in prepared])),
                                                    [1])))
    rank = comm.rank_tensor()
    columns = []
    for t, p in enumerate(prepared):
        weight_bits = _weight_bits(p.weights)
        columns.append(tf.stack([p.ids, p.segments + rank * block, tf.fill(tf.shape(p.ids), tf.constant(t, tf.int64)),
                                 weight_bits], axis=1))
    gathered = comm.allgather(tf.concat(columns, axis=0))
    all_ids, all_segments, all_tables = gathered[:, 0], gathered[:, 1], gathered[:, 2]
    all_weights = _weights_from_bits(gathered[:, 3], dtype)
    total_rows = block * n
    mine = tf.equal(all_ids % n, r)
    partials = []
    for t, p in enumerate(prepared):
        of_table = tf.equal(all_tables, t)
        local = tf.logical_and(mine, of_table)
        vectors = tf.gather(p.req.table, tf.boolean_mask(all_ids, local) // n)
        vectors = vectors * tf.boolean_mask(all_weights, local)[:, None]
        partial = tf.math.unsorted_segment_sum(vectors, tf.boolean_mask(all_segments, local), total_rows)
        norm = exchange._normaliser(tf.boolean_mask(all_weights, of_table),  # pylint: disable=protected-access
                                    tf.boolean_mask(all_segments, of_table), total_rows, p.req.combiner)
        partials.append(partial if norm is None else partial / norm[:, None])
    mine_rows = comm.reducescatter(tf.concat(partials, axis=1), "sum")
    dims = [p.req.info.dim for p in prepared]
    return [part[:p.num_segments] for part, p in zip(tf.split(mine_rows, dims, axis=1), prepared)]


def _weight_bits(weights: tf.Tensor) -> tf.Tensor:
    """Weights as int64 bit patterns, so that they travel in the id allgather."""
    if weights.dtype == tf.float64:
        return tf.bitcast(weights, tf.int64)
    as_float = tf.cast(weights, tf.float32)
    return tf.cast(tf.bitcast(as_float, tf.int32), tf.int64)


def _weights_from_bits(bits: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    if dtype == tf.float64:
        return tf.bitcast(bits, tf.float64)
    return tf.cast(tf.bitcast(tf.cast(bits, tf.int32), tf.float32), dtype)
