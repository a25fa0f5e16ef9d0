"""Runs every collective of collective.comm once, with gradients; writes rank<r>.npz."""

import os
import sys

import numpy as np
import tensorflow as tf

import comm_cases as cases
from collective import comm

out_dir = sys.argv[1]
r, n = comm.rank(), comm.world_size()
results = {}

with tf.Graph().as_default():
    def const(a):
        return tf.constant(a)

    fetch = {}
    # allreduce sum / average and their gradients.
    x = const(cases.dense(r))
    for op in ("sum", "average"):
        y = comm.allreduce(x, op)
        loss = tf.reduce_sum(y * cases.upstream(r, y.shape))
        fetch[f"allreduce_{op}"] = y
        fetch[f"allreduce_{op}_grad"] = tf.gradients(loss, x)[0]

    # grouped allreduce over float32 and float16.
    x16 = const(cases.dense(r, np.float16))
    y32, y16 = comm.grouped_allreduce([x, x16], "sum")
    fetch["grouped_f32"], fetch["grouped_f16"] = y32, y16
    loss = tf.reduce_sum(y32 * cases.upstream(r, y32.shape)) + tf.reduce_sum(
        tf.cast(y16, tf.float32) * cases.upstream(r, y16.shape))
    g32, g16 = tf.gradients(loss, [x, x16])
    fetch["grouped_f32_grad"], fetch["grouped_f16_grad"] = g32, g16

    # allgather with uneven (and empty) first dimensions.
    for dtype in (np.float32, np.float16):
        name = np.dtype(dtype).name
        g_in = tf.compat.v1.placeholder_with_default(cases.gather_input(r, dtype), [None, cases.DIM])
        g_out = comm.allgather(g_in)
        fetch[f"allgather_{name}"] = g_out
        total = sum(cases.gather_rows(k) for k in range(n))
        loss = tf.reduce_sum(tf.cast(g_out, tf.float32) * cases.upstream(r, (total, cases.DIM)))
        fetch[f"allgather_{name}_grad"] = tf.gradients(loss, g_in)[0]
    fetch["allgather_ids"] = comm.allgather(const(cases.gather_ids(r)))

    # alltoall with uneven and empty splits, float32/float16 values and int64 ids.
    splits = const(cases.splits(r, n))
    for dtype in (np.float32, np.float16):
        name = np.dtype(dtype).name
        a_in = tf.compat.v1.placeholder_with_default(cases.alltoall_input(r, n, dtype), [None, cases.DIM])
        a_out, received = comm.alltoall(a_in, splits)
        fetch[f"alltoall_{name}"], fetch[f"alltoall_{name}_received"] = a_out, received
        weights = tf.compat.v1.placeholder_with_default(
            cases.upstream(r, (64, cases.DIM)), [None, cases.DIM])[:tf.shape(a_out)[0]]
        loss = tf.reduce_sum(tf.cast(a_out, tf.float32) * weights)
        fetch[f"alltoall_{name}_grad"] = tf.gradients(loss, a_in)[0]
    fetch["alltoall_ids"] = comm.alltoall(const(cases.alltoall_ids(r, n)), splits)[0]

    # broadcast from rank 0 and from the last rank.
    b_in = const(cases.dense(r))
    fetch["broadcast_0"] = comm.broadcast(b_in, 0)
    fetch["broadcast_last"] = comm.broadcast(b_in, n - 1)

    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.local_variables_initializer())
        results.update(sess.run(fetch))

# The byte counter, on a graph with one alltoall and one allgather, run twice.
with tf.Graph().as_default():
    a_out, _ = comm.alltoall(tf.constant(cases.alltoall_input(r, n)), tf.constant(cases.splits(r, n)))
    g_out = comm.allgather(tf.constant(cases.gather_input(r)))
    counter = comm.bytes_counter()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.local_variables_initializer())
        sess.run([a_out, g_out])
        sess.run([a_out, g_out])
        results["bytes_two_runs"] = sess.run(counter)

# broadcast_string from plain Python: rank 0's and the last rank's text (multi-byte, empty), repeated calls.
results["broadcast_strings"] = np.array([comm.broadcast_string(cases.text(r), root) for root in (0, n - 1)] + [
    comm.broadcast_string("" if r == 0 else "not sent"), comm.broadcast_string(cases.text(r), 0, max_bytes=64)])

np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
