"""The combiners of a combined lookup, defined once, as TensorFlow defines them.

``combine`` reduces weighted vectors per segment (sample) exactly as
``tf.nn.embedding_lookup_sparse`` does: ``sum``; ``mean`` divides by the
segment's weight sum and ``sqrtn`` by the square root of its sum of squared
weights, both with ``div_no_nan`` (a segment whose weights sum to zero gives
zeros, a negative sum flips the sign, as in TensorFlow). The names come from
:mod:`collective.kernels.validation`, shared with the numpy references and
the GPU kernels.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from collective.kernels.validation import COMBINERS


def check_combiner(combiner: str, table: str) -> str:
    """``combiner`` if it is one of :data:`COMBINERS`, else a ValueError naming ``table``."""
    if combiner not in COMBINERS:
        raise ValueError(f"combiner {combiner!r} for table '{table}' is not one of {', '.join(COMBINERS)}; "
                         "pass one of those to the lookup")
    return combiner


def normaliser(weights: Optional[tf.Tensor], segments: tf.Tensor, num_segments, combiner: str,
               dtype: tf.DType = tf.float32) -> Optional[tf.Tensor]:
    """The per-segment divisor of ``combiner`` (None for ``sum``); ``weights`` None: ones of ``dtype``."""
    if combiner == "sum":
        return None
    if weights is None:
        weights = tf.ones_like(segments, dtype=dtype)
    if combiner == "mean":
        return tf.math.unsorted_segment_sum(weights, segments, num_segments)
    return tf.sqrt(tf.math.unsorted_segment_sum(tf.square(weights), segments, num_segments))


def normalise(summed: tf.Tensor, norm: Optional[tf.Tensor]) -> tf.Tensor:
    """``summed`` divided row-wise by ``norm`` with ``div_no_nan`` (unchanged when ``norm`` is None)."""
    return summed if norm is None else tf.math.divide_no_nan(summed, norm[:, None])


def segment_sum(data: tf.Tensor, segments: tf.Tensor, num_segments) -> tf.Tensor:
    """``tf.math.unsorted_segment_sum`` for segment ids in ``[0, num_segments)``, whose gradient is one gather.

    TensorFlow's own gradient also masks out negative segment ids (a select
    and a zeros tensor of the data's size); lookups never have any.
    """
    @tf.custom_gradient
    def summed(values):
        def grad(upstream):
            return tf.gather(tf.convert_to_tensor(upstream), segments)

        return tf.math.unsorted_segment_sum(values, segments, num_segments), grad

    return summed(data)


def combine(vectors: tf.Tensor, weights: Optional[tf.Tensor], segments: tf.Tensor, num_segments,
            combiner: str) -> tf.Tensor:
    """``[num_segments, dim]``: ``combiner`` over ``vectors * weights`` grouped by ``segments``."""
    summed = segment_sum(vectors if weights is None else vectors * weights[:, None], segments, num_segments)
    return normalise(summed, normaliser(weights, segments, num_segments, combiner, vectors.dtype))


_SORTED_REDUCTIONS = {"sum": tf.sparse.segment_sum, "mean": tf.sparse.segment_mean,
                      "sqrtn": tf.sparse.segment_sqrt_n}


def combine_sorted(distinct_vectors: tf.Tensor, index: tf.Tensor, segments: tf.Tensor, num_segments,
                   combiner: str) -> tf.Tensor:
    """:func:`combine` of unweighted ids whose ``segments`` ascend, from one vector per distinct id
    (``index``: each id's position among them), as ``tf.nn.embedding_lookup_sparse`` combines them."""
    return _SORTED_REDUCTIONS[combiner](distinct_vectors, index, segments, num_segments=num_segments)


def pad_rows(vectors: tf.Tensor, rows) -> tf.Tensor:
    """``vectors`` with zero rows appended up to ``rows`` (unchanged when ``rows`` is None)."""
    if rows is None:
        return vectors
    missing = tf.cast(rows, tf.int32) - tf.shape(vectors)[0]
    return tf.pad(vectors, [[0, tf.maximum(missing, 0)], [0, 0]])
