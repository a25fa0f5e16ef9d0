"""Grouped lookups and feature columns under CollectiveStrategy; writes rank<r>.npz.

One launch serves tests/test_grouped.py and tests/test_feature_columns.py
(keys ``columns:*`` are the feature-column results; ``packed:*``, under
``hb`` only, the same unweighted lookups with lookup-side packing off and on).

argv: out_dir backend[,backend...]; one launch serves every backend (results under
out_dir/<backend>/).
"""

import os
import sys

import numpy as np
import tensorflow as tf

import columns_cases
import grouped_cases as cases
from collective import CollectiveStrategy, comm
from collective.embedding import packing
from collective.embedding.lookup import lookup_sparse_group

out_dir, backends = sys.argv[1], sys.argv[2].split(",")


def group(tables, ids, weights, combiners):
    return lookup_sparse_group(tables, ids, weights, combiners)


def packed_lookups(strategy, features, batch):
    """Unweighted sum lookups of every table, packing off and on: values, dense table gradients, op counts."""
    results = {}
    for label, on in (("unpacked", False), ("packed", True)):
        with tf.Graph().as_default() as graph, packing.using(on):
            tables = cases.make_tables(strategy)
            ids, _ = cases.placeholders()
            outputs = lookup_sparse_group(tables, ids, None, ["sum"] * len(tables))
            objective = tf.add_n([tf.reduce_sum(o * tf.cos(tf.cast(tf.range(tf.size(o)), o.dtype)))
                                  for o in [tf.reshape(o, [-1]) for o in outputs]])
            grads = [tf.convert_to_tensor(g) for g in tf.gradients(objective, tables)]
            results[f"{label}_uniques"] = sum(op.type == "UniqueWithCounts" for op in graph.get_operations())
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                values = sess.run(outputs + grads, cases.feed_dict(ids, [None] * len(tables), features, batch))
            for i in range(len(tables)):
                results[f"{label}_{i}"], results[f"{label}_grad_{i}"] = values[i], values[len(tables) + i]
    return results


def run(backend):
    strategy = CollectiveStrategy(backend)
    r, n = strategy.rank(), strategy.world_size()
    results = {}
    with strategy.scope():
        features, _ = cases.local_batch(0, r, n)
        for label, lookup in (("grouped", group), ("ungrouped", None)):
            with tf.Graph().as_default() as graph:
                tables = cases.make_tables(strategy)
                ids, weights = cases.placeholders()
                outputs = cases.lookups(tables, ids, weights, lookup)
                counter = comm.bytes_counter()
                for op_type, count in columns_cases.collective_ops(graph).items():
                    results[f"{label}_ops_{op_type}"] = count
                weight_grads = cases.weight_gradients(outputs, weights)  # built after counting the forward's ops
                with tf.compat.v1.Session() as sess:
                    sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                    values = sess.run(outputs, cases.feed_dict(ids, weights, features, cases.BATCH // n))
                    results[f"{label}_bytes"] = sess.run(counter)
                    for i, value in enumerate(values):
                        results[f"{label}_{i}"] = value
                    feed = cases.feed_dict(ids, weights, features, cases.BATCH // n)
                    for i, value in sess.run(weight_grads, feed).items():
                        results[f"{label}_wgrad_{i}"] = value
                    for i, table in enumerate(sess.run(tables)):
                        results[f"{label}_shard_{i}"] = table

        # The last sample of this worker has no ids: pad_to_batch still gives it a (zero) row.
        with tf.Graph().as_default():
            tables = cases.make_tables(strategy)
            ids, weights = cases.placeholders()
            padded = lookup_sparse_group(tables, ids, weights, [t[3] for t in cases.TABLES], pad_to_batch=True)
            batch = cases.BATCH // n
            short = [tuple(part[rows < batch - 1] for part in (rows, values, w)) for rows, values, w in features]
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                for i, value in enumerate(sess.run(padded, cases.feed_dict(ids, weights, short, batch))):
                    results[f"padded_{i}"] = value

        if backend == "hb":
            for key, value in packed_lookups(strategy, features, cases.BATCH // n).items():
                results[f"packed:{key}"] = value

        batches = [cases.local_batch(step, r, n) for step in range(cases.STEPS)]
        losses, tables, w = cases.train(batches, strategy, group)
        results["train_losses"], results["train_w"] = losses, w
        for i, table in enumerate(tables):
            results[f"train_table_{i}"] = table

        column_batches = [columns_cases.local_batch(step, r, n) for step in range(cases.STEPS)]
        for key, value in columns_cases.run(column_batches, strategy).items():
            results[f"columns:{key}"] = value

    os.makedirs(os.path.join(out_dir, backend), exist_ok=True)
    np.savez(os.path.join(out_dir, backend, f"rank{r}.npz"), **results)


for name in backends:
    run(name)
