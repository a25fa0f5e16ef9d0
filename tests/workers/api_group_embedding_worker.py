"""GroupEmbedding (DeepRec's API) on N workers, hb and sok backends; writes rank<r>.npz.

argv: out_dir

For each backend: three sharded tables (two of dim 4, one of dim 6) looked
up by ``group_embedding_lookup_sparse`` and, in the same graph, one
``tf.nn.embedding_lookup_sparse`` per table; outputs and the gradients of
one loss through either path are saved. Then DeepRec-style embedding columns
built in ``group_embedding_column_scope`` go through ``input_layer``.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import embedding_cases as cases
from collective import CollectiveStrategy
from collective import group_embedding as ge

out_dir = sys.argv[1]
ge.enable_distributed_strategy(strategy="collective")
results = {}
for backend in ("hb", "sok"):
    strategy = CollectiveStrategy(backend)
    r, n = strategy.rank(), strategy.world_size()
    dense, (rows, ids, weights), _ = cases.local_batch(0, r, n)
    with tf.Graph().as_default():
        with strategy.embedding_scope():
            tables = [tf.compat.v1.get_variable(f"t{i}", [cases.VOCAB, dim], initializer=tf.compat.v1.constant_initializer(
                np.random.default_rng(i).normal(0, 1, (cases.VOCAB, dim)).astype(np.float32)))
                for i, dim in enumerate((4, 4, 6))]
        sp_ids = tf.SparseTensor(*cases.sparse_value(rows, ids, len(dense)))
        sp_w = tf.SparseTensor(*cases.sparse_value(rows, weights, len(dense)))
        # Ids of table 2 skip row 1 of the local batch: an empty sample in the middle and at the end.
        keep = (rows != 1) & (rows != len(dense) - 1)
        sp_holes = tf.SparseTensor(*cases.sparse_value(rows[keep], ids[keep], len(dense)))
        combiners = ["mean", "sum", "sqrtn"]
        ids_list, weights_list = [sp_ids, sp_ids, sp_holes], [None, sp_w, None]
        grouped = ge.group_embedding_lookup_sparse(tables, ids_list, combiners, sp_weights=weights_list, name="g")
        single = [tf.nn.embedding_lookup_sparse(t, i, w, combiner=c)
                  for t, i, w, c in zip(tables, ids_list, weights_list, combiners)]
        scale = [tf.constant(np.linspace(-1, 1, t.shape[1] if t.shape[1] else 1), tf.float32) for t in tables]
        grouped_grads = tf.gradients(tf.add_n([tf.reduce_sum(g * s) for g, s in zip(grouped, scale)]), tables)
        single_grads = tf.gradients(tf.add_n([tf.reduce_sum(g * s) for g, s in zip(single, scale)]), tables)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            out = sess.run({"grouped": grouped, "single": single,
                            "grouped_grads": [tf.convert_to_tensor(g) for g in grouped_grads],
                            "single_grads": [tf.convert_to_tensor(g) for g in single_grads]})
        for key, values in out.items():
            for i, value in enumerate(values):
                results[f"{backend}_{key}{i}"] = value

    # DeepRec-style feature columns built in a group_embedding_column_scope.
    with tf.Graph().as_default():
        sp_ids = tf.SparseTensor(*cases.sparse_value(rows, ids, len(dense)))
        sp_holes = tf.SparseTensor(*cases.sparse_value(rows[keep], ids[keep], len(dense)))
        with ge.group_embedding_column_scope(name="item"):
            columns = [tf.compat.v1.feature_column.embedding_column(
                tf.compat.v1.feature_column.categorical_column_with_identity(f"f{i}", cases.VOCAB), 4,
                combiner="mean", initializer=tf.compat.v1.constant_initializer(cases.table_values(i + 1)))
                for i in range(2)]
        with strategy.embedding_scope():
            emb = tf.compat.v1.feature_column.input_layer({"f0": sp_ids, "f1": sp_holes}, columns)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            results[f"{backend}_columns"] = sess.run(emb)
ge.disable_distributed_strategy()
np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
