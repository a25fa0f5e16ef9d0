"""SOK v2's ``sok.lookup_sparse``: several tables' combined lookups in one coalesced exchange.

Served by :func:`collective.embedding.lookup.lookup_sparse_group` with the
``sok`` exchange, so every table in the call shares one exchange.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import tensorflow as tf

from collective.embedding.combiners import check_combiner
from collective.embedding.lookup import lookup_sparse_group
from collective.embedding.table import shard_of
from collective.sok.init import refuse_tf_distribute

COMBINERS = ("sum", "mean")


def _sparse(ids, name: str) -> tf.SparseTensor:
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_sparse()
    if not isinstance(ids, tf.SparseTensor):
        raise TypeError(f"sok.lookup_sparse: ids for '{name}' must be a tf.SparseTensor or tf.RaggedTensor, "
                        f"got {type(ids).__name__}")
    if ids.values.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"sok.lookup_sparse: ids for '{name}' must be int32 or int64, got {ids.values.dtype.name}")
    return tf.SparseTensor(ids.indices, tf.cast(ids.values, tf.int64), ids.dense_shape)


def _in_range(sp_ids: tf.SparseTensor, rows: int, name: str) -> tf.SparseTensor:
    """``sp_ids`` once checked to lie in ``[0, rows)``, else an error naming the variable."""
    values = sp_ids.values
    message = f"sok.lookup_sparse: ids for sok.Variable '{name}' must lie in [0, {rows})"
    checks = [tf.debugging.assert_non_negative(values, message=message),
              tf.debugging.assert_less(values, tf.constant(rows, tf.int64), message=message)]
    with tf.control_dependencies(checks):
        return tf.SparseTensor(sp_ids.indices, tf.identity(values), sp_ids.dense_shape)


def lookup_sparse(params, sp_ids, sp_weights=None, combiners: Union[str, Sequence[str], None] = None,
                  name: Optional[str] = None) -> Union[tf.Tensor, List[tf.Tensor]]:
    """``tf.nn.embedding_lookup_sparse`` of each SOK variable in ``params``, with one exchange for all.

    Args:
      params: a SOK variable or a list of them.
      sp_ids: per variable, a ``tf.SparseTensor`` or ``tf.RaggedTensor`` of
        ids ``[batch, ...]`` (rows are samples).
      sp_weights: None, or per variable None or weights shaped as its ids.
      combiners: ``"sum"`` or ``"mean"`` per variable (one string for all; default ``"sum"``).

    Returns:
      ``[batch, dim]`` per variable (a list when ``params`` is a list); a
      sample without ids gives zeros.
    """
    refuse_tf_distribute("sok.lookup_sparse")
    single = not isinstance(params, (list, tuple))
    params = [params] if single else list(params)
    sp_ids = [sp_ids] if single else list(sp_ids)
    count = len(params)
    if combiners is None or isinstance(combiners, str):
        combiners = [combiners or "sum"] * count
    sp_weights = [None] * count if sp_weights is None else ([sp_weights] if single else list(sp_weights))
    if not len(sp_ids) == len(combiners) == len(sp_weights) == count:
        raise ValueError(f"sok.lookup_sparse got {count} variables, {len(sp_ids)} ids, {len(combiners)} combiners "
                         f"and {len(sp_weights)} weights; give one of each per variable")
    ids_list, weights_list = [], []
    for var, ids, weights, combiner in zip(params, sp_ids, sp_weights, combiners):
        info = shard_of(var)
        vname = getattr(var, "name", repr(var))
        if info is None:
            raise TypeError(f"sok.lookup_sparse: '{vname}' is not a sok.Variable or sok.DynamicVariable")
        if combiner not in COMBINERS:
            raise ValueError(f"sok.lookup_sparse: combiner {combiner!r} for variable '{vname}' is not one of "
                             f"{', '.join(COMBINERS)}")
        check_combiner(combiner, vname)
        ids = _sparse(ids, vname)
        if info.hash_index is None:
            ids = _in_range(ids, info.vocab, vname)
        if weights is not None:
            weights = weights.to_sparse() if isinstance(weights, tf.RaggedTensor) else weights
            weights = tf.SparseTensor(weights.indices, tf.cast(weights.values, var.dtype.base_dtype),
                                      weights.dense_shape)
        ids_list.append(ids)
        weights_list.append(weights)
    out = lookup_sparse_group(params, ids_list, weights_list, combiners, backend="sok",
                              name=name or "sok_lookup_sparse", pad_to_batch=True)
    return out[0] if single else out
