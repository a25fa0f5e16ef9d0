"""Hash-table lookups, training (one optimizer's run table-wise, ``cases.TABLE_WISE``), feature columns and the
capacity error; writes <out_dir>/<backend>/rank<r>.npz.

argv: out_dir backend[,backend...] [optimizer ...]; one launch serves every backend.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import hash_cases as cases
from collective import CollectiveStrategy
from collective import hash_embedding_column as cfc
from collective.embedding import hash_table

out_dir, backends, optimizers = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]


def lookups():
    """Dense (int64 and int32) and sparse lookups on one table, then inference lookups of unseen keys."""
    with tf.Graph().as_default():
        dense, (rows, keys, weights), _ = cases.local_batch(0, r, n)
        with strategy.embedding_scope():
            table = hash_table.hash_embedding_variable("lookup", cases.DIM, cases.CAPACITY,
                                                       initializer=cases.uniform(cases.SEEDS["lookup"]))
        index = hash_table.table_of(table)
        sp_ids = tf.SparseTensor(*cases.sparse_value(rows, keys, len(dense)))
        sp_w = tf.SparseTensor(*cases.sparse_value(rows, weights, len(dense)))
        fetch = {"dense": tf.nn.embedding_lookup(table, dense),
                 "dense_int32": tf.compat.v1.nn.embedding_lookup(table, tf.constant(dense % 2001 - 1000, tf.int32))}
        for combiner in ("sum", "mean", "sqrtn"):
            fetch[f"sparse_{combiner}"] = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner=combiner)
            fetch[f"weighted_{combiner}"] = tf.nn.embedding_lookup_sparse(table, sp_ids, sp_w, combiner=combiner)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            results.update(sess.run(fetch))
            results["size_after_training_lookups"] = sess.run(index.size())
            with hash_table.inference():
                probe = tf.constant(np.concatenate([dense[:, 0], [424242 + r, -424242 - r]]), tf.int64)
                inference = tf.nn.embedding_lookup(table, probe)
            results["inference"] = sess.run(inference)
            results["size_after_inference"] = sess.run(index.size())
            results["lookup_keys"], results["lookup_rows"] = sess.run(index.entries())


def feature_columns():
    """``categorical_column_with_embedding`` (int64 and string keys) through ``input_layer``, as the Estimator
    example uses it."""
    with tf.Graph().as_default():
        dense, (rows, keys, _), _ = cases.local_batch(0, r, n)
        option = cfc.EmbeddingVariableOption(capacity_per_worker=cases.CAPACITY)
        movie = tf.feature_column.embedding_column(
            cfc.categorical_column_with_embedding("movie", dtype=tf.int64, ev_option=option), dimension=cases.DIM,
            initializer=tf.random_uniform_initializer(cases.MINVAL, cases.MAXVAL))
        word = tf.feature_column.embedding_column(
            cfc.categorical_column_with_embedding("word", dtype=tf.string, ev_option=option, partition_num=4),
            dimension=cases.DIM, combiner="sum", initializer=tf.random_uniform_initializer(cases.MINVAL, cases.MAXVAL))
        features = {"movie": tf.SparseTensor(*cases.sparse_value(rows, keys, len(dense))),
                    "word": tf.constant(cases.words(dense))}
        with strategy.embedding_scope():
            with tf.compat.v1.variable_scope("embedding", partitioner=tf.compat.v1.fixed_size_partitioner(n)):
                fetch = {"fc_movie": tf.compat.v1.feature_column.input_layer(features, [movie]),
                         "fc_word": tf.compat.v1.feature_column.input_layer(features, [word])}
        names = [t.name for t in tf.compat.v1.get_collection(hash_table.HASH_TABLES_COLLECTION)]
        results["fc_tables"] = np.array(names)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            results.update(sess.run(fetch))


def capacity_error():
    """Every worker owns 4 distinct keys of a table with room for 2: the lookup fails naming the table."""
    with tf.Graph().as_default():
        with strategy.embedding_scope():
            table = hash_table.hash_embedding_variable("tiny_table", cases.DIM, 2)
        out = tf.nn.embedding_lookup(table, tf.range(4 * n, dtype=tf.int64))
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            try:
                sess.run(out)
                results["capacity_error"] = np.array("no error")
            except tf.errors.InvalidArgumentError as err:
                results["capacity_error"] = np.array(err.message)


def table_wise(optimizer):
    """``cases.worker_training`` with both tables placed table_wise (the planner spreads them: t1 on rank 0, t2
    on rank 1 when there are two ranks): each holder holds every key of its table, the others none."""
    placed = CollectiveStrategy(backend, sharding={"t1": "table_wise", "t2": "table_wise"})
    with placed.scope():
        trained = cases.worker_training(optimizer, placed, r, n)
    results[f"{optimizer}_holders"] = np.array([placed.plan[t].ranks[0] for t in ("t1", "t2")])
    return trained


for backend in backends:  # the functions above read backend, strategy, r, n and results
    strategy = CollectiveStrategy(backend)
    r, n = strategy.rank(), strategy.world_size()
    results = {}
    with strategy.scope():
        lookups()
        feature_columns()
        for name in optimizers:
            if name == cases.TABLE_WISE.get((backend, n)):
                losses, held, (w, b) = table_wise(name)
            else:
                losses, held, (w, b) = cases.worker_training(name, strategy, r, n)
            results[f"{name}_losses"], results[f"{name}_w"], results[f"{name}_b"] = losses, w, b
            for table, (keys, vectors) in held.items():
                results[f"{name}_{table}_keys"], results[f"{name}_{table}_vectors"] = keys, vectors
        capacity_error()
    os.makedirs(os.path.join(out_dir, backend), exist_ok=True)
    np.savez(os.path.join(out_dir, backend, f"rank{r}.npz"), **results)
