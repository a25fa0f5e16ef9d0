"""collective.embedding.combiners against TensorFlow's own ops: values and gradients.

The combiners skip the weight multiply for unweighted lookups and give their
segment sum a one-gather gradient; both must leave results and gradients as
``tf.math.unsorted_segment_sum`` and ``tf.nn.embedding_lookup_sparse`` give them.
"""

import numpy as np
import pytest
import tensorflow as tf

from collective.embedding import combiners


def _graph_run(build):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        fetches = build()
        return sess.run(fetches)


def test_segment_sum_and_its_gradient_match_tensorflow():
    rng = np.random.default_rng(0)
    data = rng.normal(size=(50, 3)).astype(np.float32)
    segments = rng.integers(0, 7, size=50)
    upstream = rng.normal(size=(9, 3)).astype(np.float32)

    def build():
        x = tf.constant(data)
        ours = combiners.segment_sum(x, tf.constant(segments), 9)
        theirs = tf.math.unsorted_segment_sum(x, tf.constant(segments), 9)
        return (ours, theirs, tf.gradients(ours, x, grad_ys=tf.constant(upstream))[0],
                tf.gradients(theirs, x, grad_ys=tf.constant(upstream))[0])

    ours, theirs, grad_ours, grad_theirs = _graph_run(build)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(grad_ours, grad_theirs)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_matches_embedding_lookup_sparse(combiner, weighted):
    rng = np.random.default_rng(1)
    table = rng.normal(size=(20, 4)).astype(np.float32)
    rows = np.sort(rng.integers(0, 6, size=30))
    ids = rng.integers(0, 20, size=30)
    weights = rng.uniform(0.5, 2.0, size=30).astype(np.float32)
    cols = np.concatenate([np.arange(np.sum(rows == r)) for r in range(6)])

    def build():
        params = tf.constant(table)
        w = tf.constant(weights) if weighted else None
        ours = combiners.combine(tf.gather(params, ids), w, tf.constant(rows), 6, combiner)
        sp_ids = tf.SparseTensor(np.stack([rows, cols], 1), ids, [6, 30])
        sp_w = tf.SparseTensor(np.stack([rows, cols], 1), weights, [6, 30]) if weighted else None
        theirs = tf.nn.embedding_lookup_sparse(params, sp_ids, sp_w, combiner=combiner)
        return ours, theirs, tf.gradients(ours, params)[0], tf.gradients(theirs, params)[0]

    ours, theirs, grad_ours, grad_theirs = _graph_run(build)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    as_dense = [np.zeros_like(table) for _ in range(2)]
    for out, g in zip(as_dense, (grad_ours, grad_theirs)):
        np.add.at(out, g.indices, g.values)
    np.testing.assert_allclose(as_dense[0], as_dense[1], rtol=1e-5, atol=1e-6)
