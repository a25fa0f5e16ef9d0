"""Input synchronisation: every worker runs the same number of steps.

Embedding lookups are collectives, so a worker whose input has ended while
others still have batches would block them forever. The helpers here follow
HybridBackend's data sync:

1. :func:`pad_with_empty_batches` makes a batched ``tf.data`` pipeline
   endless: after its last batch it yields batches with zero rows, and every
   element carries a ``has_data`` flag.
2. :func:`synchronise` allreduces the flags (and the batch sizes) once per
   step and raises ``OutOfRangeError`` on every worker at the same step, the
   first step in which no worker has data left. Estimator and
   ``MonitoredTrainingSession`` treat that error as the end of the input.

A worker with an empty batch contributes zero gradients (its loss is a mean
over no rows), so the steps at the end of uneven input average the remaining
workers' gradients over all ``N`` workers.

Batch normalisation on an empty batch: the mean and variance of zero rows
are NaN (0 / 0), which would reach the layer's moving averages on that
worker and, through the allreduced gradient of ``gamma``, every worker's
weights. Under ``scope()`` Keras' own zero-size-batch handling (the one
``tf.distribute`` strategies switch on for partial batches) is always on,
for ``tf.keras.layers.BatchNormalization`` and
``tf.compat.v1.layers.batch_normalization``, fused or not: an empty step
leaves that worker's ``moving_mean`` and ``moving_variance`` unchanged and
gives ``gamma`` and ``beta`` zero gradients. Raw ops
(``tf.nn.fused_batch_norm``, ``tf.nn.moments``) get no such guard.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import tensorflow as tf

from collective import comm
from collective.tf_internals import batch_normalization, nest, patches

HAS_DATA_KEY = "__collective_has_data__"
ROWS_KEY = "__collective_rows__"
_PLAIN_FEATURES_KEY = "__collective_features__"


@dataclasses.dataclass(frozen=True)
class StepInput:
    """One step's synchronised input.

    Attributes:
      features, labels: the batch (zero rows on a worker whose input has ended).
      has_data: bool scalar, whether this worker's batch is real.
      workers_with_data: int32 scalar, how many workers have a real batch.
      global_rows: int64 scalar, rows in this step summed over workers.
    """

    features: Any
    labels: Any
    has_data: tf.Tensor
    workers_with_data: tf.Tensor
    global_rows: tf.Tensor


def shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset.shard(world_size, rank)``: every worker keeps every N-th element (batch, if batched)."""
    return dataset.shard(comm.world_size(), comm.rank())


def _empty_like(spec: tf.TypeSpec, where: str):
    """A value of ``spec`` with zero rows (unknown dimensions become 0)."""
    if isinstance(spec, tf.TensorSpec):
        if spec.shape.rank is None:
            raise ValueError(f"input element {where} has unknown rank; give it a static rank so that empty "
                             "batches can be built for uneven input")
        dims = [0] + [d if d is not None else 0 for d in spec.shape.as_list()[1:]] if spec.shape.rank else []
        if not dims:
            raise ValueError(f"input element {where} is a scalar; batch the dataset so every element has rows")
        return tf.zeros(dims, spec.dtype)
    if isinstance(spec, tf.SparseTensorSpec):
        rank = spec.shape.rank
        if rank is None:
            raise ValueError(f"sparse input element {where} has unknown rank; give it a static rank")
        dense_shape = [0] + [d if d is not None else 0 for d in spec.shape.as_list()[1:]]
        return tf.SparseTensor(tf.zeros([0, rank], tf.int64), tf.zeros([0], spec.dtype),
                               tf.constant(dense_shape, tf.int64))
    raise ValueError(f"input element {where} is a {type(spec).__name__}; only dense and sparse tensors can be "
                     "padded for uneven input (convert ragged tensors with .to_sparse())")


def _leading_rows(value) -> tf.Tensor:
    """Rows of the first tensor in ``value`` (a nest of tensors and sparse tensors)."""
    for item in tf.nest.flatten(value, expand_composites=False):
        if isinstance(item, tf.SparseTensor):
            return tf.cast(item.dense_shape[0], tf.int64)
        if isinstance(item, tf.Tensor) and item.shape.rank:
            return tf.shape(item, out_type=tf.int64)[0]
    return tf.constant(0, tf.int64)


def pad_with_empty_batches(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` (batched) with a flag per element, then empty batches forever.

    Elements ``features`` or ``(features, labels)`` become
    ``({**features, HAS_DATA_KEY: flag, ROWS_KEY: rows}, labels)``; a
    features tensor that is not a dict is kept under an internal key and
    restored by :func:`split_features`.
    """
    spec = dataset.element_spec
    has_labels = isinstance(spec, tuple) and len(spec) == 2
    empty = nest.map_structure_with_paths(lambda path, s: _empty_like(s, path or "features"), spec)

    def tag(flag):
        def fn(*element):
            features, labels = (element[0], element[1]) if has_labels else (element[0], None)
            features = dict(features) if isinstance(features, Mapping) else {_PLAIN_FEATURES_KEY: features}
            features[HAS_DATA_KEY] = tf.constant(flag)
            features[ROWS_KEY] = _leading_rows(element[0])
            return (features, labels) if has_labels else features
        return fn

    # The padding is tagged here, not by a second map: each map is a function traced in every input graph.
    padding = tag(False)(*empty) if type(empty) is tuple else tag(False)(empty)  # as map passes an element
    return dataset.map(tag(True)).concatenate(tf.data.Dataset.from_tensors(padding).repeat())


def has_sync_keys(features) -> bool:
    """Whether ``features`` came from :func:`pad_with_empty_batches`."""
    return isinstance(features, Mapping) and HAS_DATA_KEY in features


def split_features(features):
    """``(user features, has_data, rows)`` from padded features."""
    features = dict(features)
    has_data, rows = features.pop(HAS_DATA_KEY), features.pop(ROWS_KEY)
    if _PLAIN_FEATURES_KEY in features:
        features = features[_PLAIN_FEATURES_KEY]
    return features, has_data, rows


def synchronise(features, labels=None) -> StepInput:
    """Allreduces the step's flags; raises ``OutOfRangeError`` on every worker once all are out of data.

    ``features`` must come from :func:`pad_with_empty_batches`. The returned
    features and labels depend on the check, so nothing that reads them
    (embedding lookups among it) runs in the step that ends the input.
    """
    features, has_data, rows = split_features(features)
    counts = comm.allreduce(tf.stack([tf.cast(has_data, tf.int64), tf.cast(rows, tf.int64)]), "sum")
    workers_with_data = tf.cast(counts[0], tf.int32)
    exhausted = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(0))
    check = tf.cond(workers_with_data > 0, lambda: tf.constant(0, tf.int64), exhausted.get_next,
                    name="collective_input_sync")
    with tf.control_dependencies([check]):
        features = tf.nest.map_structure(_identity, features)
        labels = tf.nest.map_structure(_identity, labels) if labels is not None else None
        return StepInput(features, labels, tf.identity(has_data), tf.identity(workers_with_data),
                         tf.identity(counts[1]))


def _identity(value):
    if isinstance(value, tf.SparseTensor):
        return tf.SparseTensor(tf.identity(value.indices), tf.identity(value.values),
                               tf.identity(value.dense_shape))
    return tf.identity(value)


def batch_norm_supports_empty_batches(layer) -> bool:  # pylint: disable=unused-argument
    """Keras batch norm's ``_support_zero_size_input`` under ``scope()``: always on (see the module docstring).

    On a non-empty batch the layer computes what it computes without it.
    """
    return True
