"""DeepRec's GroupEmbedding API over collective's grouped exchange.

    import collective.group_embedding as ge

    strategy = ge.enable_distributed_strategy(strategy="collective")
    with strategy.embedding_scope():
        user = tf.compat.v1.get_variable("user", [vocab_u, 16])    # sharded by rows, id % N
        item = tf.compat.v1.get_variable("item", [vocab_i, 16])
    user_emb, item_emb = ge.group_embedding_lookup_sparse([user, item], [sp_user, sp_item], ["mean", "sum"])

``group_embedding_lookup_sparse`` looks up all its tables with one exchange
per group (:func:`collective.embedding.lookup.lookup_sparse_group`): with
the ``hb`` backend one id alltoall and one vector alltoall per embedding
dimension, with ``sok`` one allgather of ids and one alltoall of partial sums for all tables.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, List, Optional, Sequence

import tensorflow as tf

from collective import comm
from collective.embedding.lookup import lookup_sparse_group
from collective.strategy import CollectiveStrategy

logger = logging.getLogger("collective.group_embedding")

STRATEGIES = ("collective",)
PARTITION_STRATEGIES = ("mod",)
COMBINERS = ("mean", "sum", "sqrtn")

_enabled: Optional[CollectiveStrategy] = None
_patches: Optional[contextlib.ExitStack] = None


def enable_distributed_strategy(strategy: str = "collective") -> CollectiveStrategy:
    """DeepRec's ``tf.config.experimental.enable_distributed_strategy``: starts distributed training.

    Initialises Horovod and installs collective's changes to TensorFlow for
    the rest of the process (as DeepRec's switch is global; undo with
    :func:`disable_distributed_strategy`), so the lookups of tables made in
    the returned strategy's ``embedding_scope()`` go through the exchange
    without an enclosing ``scope()``. Calling it again returns the same strategy.

    Args:
      strategy: ``"collective"``, the one supported choice.
    """
    global _enabled, _patches
    if strategy not in STRATEGIES:
        raise ValueError(f"enable_distributed_strategy: strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    if _enabled is None:
        comm.init()
        _enabled = CollectiveStrategy()
        _patches = contextlib.ExitStack()
        _patches.enter_context(_enabled.scope())
    return _enabled


def disable_distributed_strategy() -> None:
    """Undoes :func:`enable_distributed_strategy`: TensorFlow is restored exactly."""
    global _enabled, _patches
    if _patches is not None:
        _patches.close()
    _enabled, _patches = None, None


def _as_list(value, what: str, count: int) -> list:
    if value is None:
        return [None] * count
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"group_embedding_lookup_sparse: {what} must be a list or tuple, got {type(value).__name__}")
    if len(value) != count:
        raise ValueError(f"group_embedding_lookup_sparse: {len(value)} {what} for {count} params; give one per table")
    return list(value)


def group_embedding_lookup_sparse(params: Sequence, sp_ids: Sequence[tf.SparseTensor], combiners: Sequence[str],
                                  partition_strategy: str = "mod", sp_weights: Optional[Sequence] = None,
                                  name: Optional[str] = None) -> List[tf.Tensor]:
    """``tf.nn.embedding_lookup_sparse`` of several tables fused into one exchange (DeepRec's API).

    Args:
      params: one table per lookup: sharded tables (made in
        ``embedding_scope()``) are fused; other variables are looked up locally.
      sp_ids: one ``SparseTensor`` of ids per table (row = sample).
      combiners: ``mean``, ``sum`` or ``sqrtn`` per table.
      partition_strategy: ``"mod"`` only (row ``i`` lives on worker ``i % N``).
      sp_weights: optional ``SparseTensor`` of weights per table (None entries allowed).
      name: name scope of the ops.

    Returns:
      One ``[batch, dim]`` tensor per table (``batch = sp_ids[i].dense_shape[0]``,
      zeros for samples without ids).
    """
    if partition_strategy not in PARTITION_STRATEGIES:
        raise ValueError(f"group_embedding_lookup_sparse: partition_strategy={partition_strategy!r} is not one of "
                         f"{', '.join(PARTITION_STRATEGIES)}")
    if not isinstance(params, (list, tuple)) or not params:
        raise TypeError("group_embedding_lookup_sparse: params must be a non-empty list of embedding variables")
    count = len(params)
    ids_list = _as_list(sp_ids, "sp_ids", count)
    combiner_list = _as_list(combiners, "combiners", count)
    weights_list = _as_list(sp_weights, "sp_weights", count)
    for i, (ids, combiner) in enumerate(zip(ids_list, combiner_list)):
        if not isinstance(ids, tf.SparseTensor):
            raise TypeError(f"group_embedding_lookup_sparse: sp_ids[{i}] must be a tf.SparseTensor, got "
                            f"{type(ids).__name__}")
        if combiner not in COMBINERS:
            raise ValueError(f"group_embedding_lookup_sparse: combiners[{i}]={combiner!r} is not one of "
                             f"{', '.join(COMBINERS)}")
    comm.init()
    return lookup_sparse_group(list(params), ids_list, weights_list, combiner_list, name=name, pad_to_batch=True)


@contextlib.contextmanager
def group_embedding_column_scope(name: Optional[str] = None) -> Iterator[None]:
    """DeepRec's ``tf.feature_column.group_embedding_column_scope``: build embedding columns inside it.

    collective needs no marking to fuse column lookups: inside
    ``CollectiveStrategy.scope()`` (or after :func:`enable_distributed_strategy`),
    ``tf.compat.v1.feature_column.input_layer`` and ``DenseFeatures`` look up
    all their sharded columns with one grouped exchange. This scope is
    accepted so DeepRec code runs unchanged; it opens a name scope ``name``.
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"group_embedding_column_scope: name must be a string, got {name!r}")
    with tf.name_scope(name or "group_embedding_column_scope"):
        yield


__all__ = ["COMBINERS", "disable_distributed_strategy", "enable_distributed_strategy",
           "group_embedding_column_scope", "group_embedding_lookup_sparse"]
