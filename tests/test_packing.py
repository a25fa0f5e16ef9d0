"""Lookup-side packing (docs/packing.md, stage 1) in one process: the per-table results, fewer ops.

The same lookups are built with packing off and on (``collective.embedding.packing.using``) at world
size 1; values and table gradients must be bitwise the per-table path's, with one ``UniqueWithCounts``
and one sorted segment reduction per pack instead of one per table. Two and three workers (the ``hb``
exchange) are compared in tests/workers/grouped_worker.py (``packed:*`` keys, tests/test_grouped.py).
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.context import Context, OptionError
from collective.embedding import packing
from collective.embedding.lookup import lookup_sparse_group

BATCH = 6
# name, vocab, dim, combiner, weighted. Packs: {a, b, c} (dim 4, sum) and {e, f} (dim 3, sum); d (mean) is
# alone and g (weighted) is not packable.
TABLES = (("a", 7, 4, "sum", False), ("b", 9, 4, "sum", False), ("c", 5, 4, "sum", False),
          ("d", 8, 4, "mean", False), ("e", 6, 3, "sum", False), ("f", 11, 3, "sum", False),
          ("g", 10, 4, "sum", True))
REDUCTIONS = ("SparseSegmentSumWithNumSegments", "SparseSegmentMeanWithNumSegments")


def _sparse(rng, vocab):
    rows = np.sort(rng.integers(0, BATCH - 1, 12))  # the last sample has no ids
    cols = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
    ids = rng.integers(0, vocab, rows.size)
    ids[:2] = vocab - 1  # a repeated id
    return np.stack([rows, cols], 1), ids, rng.uniform(0.5, 2.0, rows.size).astype(np.float32)


def _build_and_run(packs: bool):
    rng = np.random.default_rng(3)
    strategy = CollectiveStrategy("hb")
    with tf.Graph().as_default() as graph, strategy.scope(), packing.using(packs):
        with strategy.embedding_scope():
            tables = [tf.compat.v1.get_variable(name, [vocab, dim], initializer=tf.compat.v1.constant_initializer(
                np.random.default_rng(i).normal(size=(vocab, dim)).astype(np.float32)))
                for i, (name, vocab, dim, _, _) in enumerate(TABLES)]
        ids, weights = [], []
        for _, vocab, _, _, weighted in TABLES:
            at, values, w = _sparse(rng, vocab)
            ids.append(tf.SparseTensor(at, values, [BATCH, 3]))
            weights.append(tf.SparseTensor(at, w, [BATCH, 3]) if weighted else None)
        outputs = lookup_sparse_group(tables, ids, weights, [t[3] for t in TABLES], pad_to_batch=True)
        probe = [tf.cos(tf.reshape(tf.range(tf.size(o), dtype=o.dtype), tf.shape(o))) for o in outputs]
        objective = tf.add_n([tf.reduce_sum(o * p) for o, p in zip(outputs, probe)])
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(objective, tables)]
        ops = collections.Counter(op.type for op in graph.get_operations())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run(outputs), sess.run(grads), ops


def test_packed_lookups_equal_the_per_table_path_with_one_unique_and_one_combine_per_pack():
    values, grads, ops = _build_and_run(False)
    packed_values, packed_grads, packed_ops = _build_and_run(True)
    for i, name in enumerate(t[0] for t in TABLES):
        np.testing.assert_array_equal(packed_values[i], values[i], err_msg=name)
        np.testing.assert_array_equal(packed_grads[i], grads[i], err_msg=name)
        assert values[i].shape == (BATCH, TABLES[i][2]) and grads[i].any(), name
    # Unweighted lookups take one unique each (g, weighted, none); packed: one per pack, d alone.
    assert ops["UniqueWithCounts"] == 6 and packed_ops["UniqueWithCounts"] == 3
    assert sum(ops[r] for r in REDUCTIONS) == 6 and sum(packed_ops[r] for r in REDUCTIONS) == 3


def test_collective_packing_is_off_unless_set_and_refuses_other_values():
    assert Context.from_env({}).packing is False
    assert Context.from_env({"COLLECTIVE_PACKING": "1"}).packing is True
    with pytest.raises(OptionError, match="COLLECTIVE_PACKING='yes' is not one of 0, 1"):
        Context.from_env({"COLLECTIVE_PACKING": "yes"})
