"""Unequal input shares: rank r of the job gets 10 - 3r batches; a small sharded-table model."""

import contextlib

import numpy as np
import tensorflow as tf

VOCAB, DIM, BATCH, LR = 20, 4, 4, 0.1


def batch_count(rank: int) -> int:
    return 10 - 3 * rank


def worker_data(rank: int):
    """``(ids [rows, 2], targets [rows, 1])`` of rank ``rank``'s whole share."""
    rng = np.random.default_rng(50 + rank)
    rows = batch_count(rank) * BATCH
    return rng.integers(0, VOCAB, (rows, 2)).astype(np.int64), rng.normal(size=(rows, 1)).astype(np.float32)


def model(ids, targets, embedding_scope=None):
    """``(loss, table, w)``: ids -> summed rows of a [VOCAB, DIM] table -> linear -> mean squared error."""
    rng = np.random.default_rng(7)
    with embedding_scope() if embedding_scope else contextlib.nullcontext():
        table = tf.compat.v1.get_variable("table", [VOCAB, DIM], initializer=tf.compat.v1.constant_initializer(
            rng.normal(0, 0.5, (VOCAB, DIM)).astype(np.float32)))
    w = tf.compat.v1.get_variable("w", [DIM, 1], initializer=tf.compat.v1.constant_initializer(
        rng.normal(0, 0.5, (DIM, 1)).astype(np.float32)))
    prediction = tf.matmul(tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1), w)
    return tf.compat.v1.losses.mean_squared_error(targets, prediction), table, w
