"""Lookups on sharded tables, served by the exchanges: the one front door.

:func:`run` serves any list of :class:`Request` objects: it checks and
flattens them, serves world size 1 locally, and hands the rest to each
table's exchange in groups that cross the wire once each; a single lookup
is a group of one. The backend is the one named by the call, else the
innermost :func:`using` block's (``CollectiveStrategy.scope()`` opens one),
else ``COLLECTIVE_STRATEGY``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf

from collective import context
from collective.embedding import exchanges, gradient_norms, packing
from collective.embedding.combiners import pad_rows
from collective.embedding.exchanges.base import Exchange, Prepared, Request, prepare, rows_of_keys, serve_locally
from collective.embedding.table import ShardInfo, shard_of
from collective.sharding import planner

_active = threading.local()


@contextlib.contextmanager
def using(backend: str) -> Iterator[None]:
    """Lookups made in the block use ``backend`` unless they name one."""
    stack = _active.__dict__.setdefault("stack", [])
    stack.append(exchanges.check(backend))
    try:
        yield
    finally:
        stack.pop()


def current() -> str:
    """The backend of the innermost :func:`using` block, else ``COLLECTIVE_STRATEGY`` (default ``hb``)."""
    stack = getattr(_active, "stack", None)
    return stack[-1] if stack else context.get().backend


def exchange_for(p: Prepared, backend: str) -> Exchange:
    """The exchange that serves ``p``'s table when the step's backend is ``backend``."""
    return exchanges.get(planner.exchange_for(p.info.placement, backend))


# Lookups build graph ops in plain Python: when a Keras layer or tf.function calls in, AutoGraph must not
# rewrite them (in a long test run its cache of converted dataclass constructors mixed up two classes).
@tf.autograph.experimental.do_not_convert
def run(requests: Sequence[Request], backend: Optional[str] = None) -> List[tf.Tensor]:
    """Each request's result, with one exchange per group of compatible requests."""
    backend = backend or current()
    prepared = [prepare(req) for req in requests]
    outputs: List[Optional[tf.Tensor]] = [None] * len(prepared)
    groups: Dict[Tuple, List[int]] = {}
    local: Dict[Tuple, List[int]] = {}
    packs = packing.enabled()
    for i, p in enumerate(prepared):
        if p.info.world_size == 1:
            if packs and packing.packable(p):
                local.setdefault((p.dtype, p.info.dim), []).append(i)
            else:
                outputs[i] = serve_locally(p)
            continue
        exchange = exchange_for(p, backend)
        groups.setdefault((exchange.name, exchange.group_key(p)), []).append(i)
    for indices in local.values():
        served = packing.serve_groups([prepared[i] for i in indices], _serve_each_locally, rows_of_keys)
        for i, out in zip(indices, served):
            outputs[i] = out
    for (name, _), indices in groups.items():
        for i, out in zip(indices, exchanges.get(name).exchange([prepared[i] for i in indices])):
            outputs[i] = out
    for p, out in zip(prepared, outputs):
        gradient_norms.record(p.req.table, out, p.req.combiner)
    return outputs


def _serve_each_locally(group: Sequence[Prepared]) -> List[tf.Tensor]:
    return [serve_locally(p) for p in group]


@tf.autograph.experimental.do_not_convert
def lookup(table: tf.Variable, info: ShardInfo, ids: tf.Tensor, backend: Optional[str] = None) -> tf.Tensor:
    """``tf.nn.embedding_lookup`` on a sharded table: vectors of shape ``ids.shape + [dim]``."""
    return run([Request(table, info, tf.convert_to_tensor(ids))], backend)[0]


@tf.autograph.experimental.do_not_convert
def lookup_sparse(table: tf.Variable, info: ShardInfo, ids: tf.Tensor, segments: tf.Tensor,
                  weights: Optional[tf.Tensor], combiner: str, backend: Optional[str] = None) -> tf.Tensor:
    """Combined vectors per segment (sample): ``[max(segments) + 1, dim]``, as TensorFlow's own lookup."""
    return run([Request(table, info, ids, segments, weights, combiner)], backend)[0]


@tf.autograph.experimental.do_not_convert
def lookup_sparse_group(tables: Sequence[tf.Variable], sp_ids_list: Sequence[tf.SparseTensor],
                        sp_weights_list: Optional[Sequence[Optional[tf.SparseTensor]]] = None,
                        combiners: Optional[Sequence[str]] = None, backend: Optional[str] = None,
                        name: Optional[str] = None, pad_to_batch: bool = False) -> List[tf.Tensor]:
    """``tf.nn.embedding_lookup_sparse`` of several tables with one exchange per group.

    Args:
      tables: one variable per lookup; sharded tables (made in
        ``embedding_scope()``) are coalesced, others use TensorFlow's lookup.
      sp_ids_list: ``SparseTensor`` of ids per table (rows are samples), in canonical (row-major) order as
        ``tf.nn.embedding_lookup_sparse`` takes them (``tf.sparse.reorder`` puts one in order).
      sp_weights_list: optional ``SparseTensor`` of weights per table (or None entries).
      combiners: ``sum``, ``mean`` or ``sqrtn`` per table (default ``mean``).
      backend: a registered backend name (default: the strategy's).
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
                         f"{len(sp_weights_list)} weight tensors and {len(combiners)} combiners; give one of "
                         "each per table")
    outputs: List[Optional[tf.Tensor]] = [None] * count
    requests, at = [], []
    with tf.name_scope(name or "lookup_sparse_group"):
        for i, (table, sp_ids, sp_weights, combiner) in enumerate(zip(tables, sp_ids_list, sp_weights_list,
                                                                      combiners)):
            info = shard_of(table)
            rows = sp_ids.dense_shape[0] if pad_to_batch else None
            if info is None:
                combined = tf.nn.embedding_lookup_sparse(table, sp_ids, sp_weights, combiner=combiner)
                outputs[i] = pad_rows(combined, rows)
                continue
            requests.append(Request(table, info, sp_ids.values, sp_ids.indices[:, 0],
                                    None if sp_weights is None else sp_weights.values, combiner, rows,
                                    sorted_segments=True))
            at.append(i)
        for i, out in zip(at, run(requests, backend)):
            outputs[i] = out
    return outputs
