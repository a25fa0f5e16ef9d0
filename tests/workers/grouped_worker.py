"""Grouped lookups of several sharded tables under CollectiveStrategy; writes rank<r>.npz.

argv: out_dir backend
"""

import os
import sys

import numpy as np
import tensorflow as tf

import grouped_cases as cases
from collective import CollectiveStrategy, comm
from collective.embedding.grouped import lookup_sparse_group

out_dir, backend = sys.argv[1], sys.argv[2]
strategy = CollectiveStrategy(backend)
r, n = strategy.rank(), strategy.world_size()
results = {}


def group(tables, ids, weights, combiners):
    return lookup_sparse_group(tables, ids, weights, combiners)


def collective_ops(graph):
    counts = {}
    for op in graph.get_operations():
        if op.type.startswith("Horovod"):
            counts[op.type] = counts.get(op.type, 0) + 1
    return counts


with strategy.scope():
    features, _ = cases.local_batch(0, r, n)
    for label, lookup in (("grouped", group), ("ungrouped", None)):
        with tf.Graph().as_default() as graph:
            tables = cases.make_tables(strategy)
            ids, weights = cases.placeholders()
            outputs = cases.lookups(tables, ids, weights, lookup)
            counter = comm.bytes_counter()
            for op_type, count in collective_ops(graph).items():
                results[f"{label}_ops_{op_type}"] = count
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                values = sess.run(outputs, cases.feed_dict(ids, weights, features, cases.BATCH // n))
                results[f"{label}_bytes"] = sess.run(counter)
                for i, value in enumerate(values):
                    results[f"{label}_{i}"] = value
                for i, table in enumerate(sess.run(tables)):
                    results[f"{label}_shard_{i}"] = table

    batches = [cases.local_batch(step, r, n) for step in range(cases.STEPS)]
    losses, tables, w = cases.train(batches, strategy, group)
    results["train_losses"], results["train_w"] = losses, w
    for i, table in enumerate(tables):
        results[f"train_table_{i}"] = table

np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
