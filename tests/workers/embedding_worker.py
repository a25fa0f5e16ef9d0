"""Sharded lookups and training under CollectiveStrategy; writes rank<r>.npz.

argv: out_dir backend[,backend...] [optimizer ...]; one launch serves every backend
(results under out_dir/<backend>/).
"""

import os
import sys

import numpy as np
import tensorflow as tf

import embedding_cases as cases
from collective import CollectiveStrategy
from collective.checkpoint import manifest

out_dir, backends, optimizers = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]


def run(backend):
    strategy = CollectiveStrategy(backend)
    r, n = strategy.rank(), strategy.world_size()
    results = {}
    with strategy.scope():
        # Lookups of every kind on one step's data.
        with tf.Graph().as_default():
            dense, (rows, ids, weights), _ = cases.local_batch(0, r, n)
            with strategy.embedding_scope():
                table = tf.compat.v1.get_variable(
                    "table", [cases.VOCAB, cases.DIM],
                    initializer=tf.compat.v1.constant_initializer(cases.table_values(1)),
                    partitioner=tf.compat.v1.fixed_size_partitioner(n))
            # Pretrained tables: the whole table given as a tensor (TF1) or an array (tf.Variable).
            with strategy.embedding_scope():
                pretrained = {"pretrained_v1": tf.compat.v1.get_variable(
                                  "pretrained_v1", initializer=tf.constant(cases.table_values(3))),
                              "pretrained_v2": tf.Variable(cases.table_values(4), name="pretrained_v2")}
            sp_ids = tf.SparseTensor(*cases.sparse_value(rows, ids, len(dense)))
            sp_w = tf.SparseTensor(*cases.sparse_value(rows, weights, len(dense)))
            fetch = {"dense": tf.nn.embedding_lookup(table, dense),
                     "dense_v1_int32": tf.compat.v1.nn.embedding_lookup(table, tf.constant(dense, tf.int32))}
            for combiner in ("sum", "mean", "sqrtn"):
                fetch[f"sparse_{combiner}"] = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner=combiner)
                fetch[f"weighted_{combiner}"] = tf.nn.embedding_lookup_sparse(table, sp_ids, sp_w, combiner=combiner)
            # The gradient with respect to the weights crosses the exchange (sok sends them as bits).
            w_in = tf.constant(weights)
            weighted = tf.nn.embedding_lookup_sparse(
                table, sp_ids, tf.SparseTensor(sp_w.indices, w_in, sp_w.dense_shape), combiner="sum")
            probe = tf.constant(cases.probe(len(dense)))
            fetch["weights_grad"] = tf.gradients(tf.reduce_sum(weighted * probe), w_in)[0]
            # Weight sums below and at zero: TensorFlow divides with div_no_nan (a sign flip, zeros).
            signed_rows, signed_ids, signed_w = cases.SIGNED
            sp_signed = tf.SparseTensor(*cases.sparse_value(signed_rows, signed_ids, 2))
            sp_signed_w = tf.SparseTensor(*cases.sparse_value(signed_rows, signed_w, 2))
            for combiner in ("mean", "sqrtn"):
                fetch[f"signed_{combiner}"] = tf.nn.embedding_lookup_sparse(table, sp_signed, sp_signed_w,
                                                                            combiner=combiner)
            # Rows 1 and 2 of the local batch lose their ids: safe lookup gives zeros there.
            keep = (rows != 1) & (rows != 2)
            sp_holes = tf.SparseTensor(*cases.sparse_value(rows[keep], ids[keep], len(dense)))
            fetch["safe_mean"] = tf.nn.safe_embedding_lookup_sparse(table, sp_holes, combiner="mean")
            column = tf.compat.v1.feature_column.embedding_column(
                tf.compat.v1.feature_column.categorical_column_with_identity("item", cases.VOCAB), cases.DIM,
                combiner="sqrtn", initializer=tf.compat.v1.constant_initializer(cases.table_values(2)))
            with strategy.embedding_scope():
                fetch["feature_column"] = tf.compat.v1.feature_column.input_layer({"item": sp_ids}, [column])
            # Ragged ids: tf.nn.embedding_lookup and a Keras Embedding keep the row splits.
            ragged = tf.RaggedTensor.from_value_rowids(tf.constant(ids), tf.constant(rows), nrows=len(dense))
            fetch["ragged"] = tf.nn.embedding_lookup(table, ragged).to_tensor()
            with strategy.embedding_scope():
                keras_embedding = tf.keras.layers.Embedding(
                    cases.VOCAB, cases.DIM, embeddings_initializer=tf.keras.initializers.Constant(cases.table_values(5)))
                fetch["keras_ragged"] = keras_embedding(ragged).to_tensor()
                # A partitioned table with a seeded random initializer: plain TF initialises each partition.
                seeded = tf.compat.v1.get_variable(
                    "seeded", [cases.VOCAB, cases.DIM], initializer=tf.compat.v1.random_uniform_initializer(seed=11),
                    partitioner=tf.compat.v1.fixed_size_partitioner(cases.SEEDED_PARTITIONS))
            with tf.compat.v1.Session() as sess:
                # The global initializer alone (the byte counter is a local variable) suffices.
                sess.run(tf.compat.v1.global_variables_initializer())
                results.update(sess.run(fetch))
                results["table_shard"] = sess.run(table)
                results["seeded_shard"] = sess.run(seeded)
                for key, var in pretrained.items():
                    results[f"{key}_shard"] = sess.run(var)
                    results[f"{key}_dense"] = sess.run(tf.nn.embedding_lookup(var, dense))

        # Training parity.
        batches = [cases.local_batch(step, r, n) for step in range(cases.STEPS)]
        for name in optimizers:
            losses, tables, dense_vars = cases.train(name, batches, strategy, with_small=True)
            results[f"{name}_losses"] = losses
            results[f"{name}_t1"], results[f"{name}_t2"] = tables
            results[f"{name}_w"], results[f"{name}_b"], results[f"{name}_small"] = dense_vars

    if backend in ("hb", "sok") and optimizers and n > 1:
        # Table-wise tables (issue 43): each whole on the rank the planner picks, trained as one process trains.
        # Under hb also saved, and restored into row-wise tables: the checkpoint holds the logical tables.
        table_wise = CollectiveStrategy(backend, sharding={"t1": "table_wise", "t2": "table_wise"})
        prefix = os.path.join(out_dir, "tw", "model.ckpt") if backend == "hb" else None
        with table_wise.scope():
            losses, tables, dense_vars = cases.train(optimizers[-1], batches, table_wise, with_small=True,
                                                     save_to=prefix)
        results["tw_losses"], (results["tw_t1"], results["tw_t2"]) = losses, tables
        results["tw_w"], results["tw_b"], results["tw_small"] = dense_vars
        results["tw_holders"] = np.array([table_wise.plan[t].ranks[0] for t in ("t1", "t2")])
        if prefix is not None:
            with strategy.scope():
                results["tw_restored_t1"], results["tw_restored_t2"] = cases.restored_tables(
                    optimizers[-1], strategy, prefix)
            results["tw_recorded"] = np.array([manifest.read_plan(prefix)[t].placement for t in ("t1", "t2")])

    if backend in ("hb", "sok") and optimizers:
        # Column-wise tables (issue 43): each rank holds a slice of every row's dims (4 dims: 2, 1, 1 on 3
        # workers), "small" (2 rows) with fewer rows than 3 workers; Adam's slots sliced the same way. Under hb
        # also saved: the checkpoint holds the logical tables (the slots' round trip: test_checkpoint's chain).
        column_wise = CollectiveStrategy(backend, sharding={t: "column_wise" for t in ("t1", "t2", "small")})
        prefix = os.path.join(out_dir, "cw", "model.ckpt") if backend == "hb" and n > 1 else None
        with column_wise.scope():
            losses, tables, dense_vars = cases.train(optimizers[-1], batches, column_wise, with_small=True,
                                                     save_to=prefix, small_in_scope=True)
        results["cw_losses"], (results["cw_t1"], results["cw_t2"]) = losses, tables
        results["cw_w"], results["cw_b"], results["cw_small"] = dense_vars
        results["cw_placements"] = np.array([column_wise.plan[t].placement for t in ("t1", "t2", "small")])
        if prefix is not None:
            for name in ("t1", "t2", "small"):
                results[f"cw_saved_{name}"] = tf.train.load_variable(prefix, name)

    os.makedirs(os.path.join(out_dir, backend), exist_ok=True)
    np.savez(os.path.join(out_dir, backend, f"rank{r}.npz"), **results)


for name in backends:
    run(name)
