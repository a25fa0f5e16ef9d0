"""A SOK v2 program (TF2, tf.function, Horovod-style) and its pure-TF twin; then dump/load and bad input.

argv: out_dir previous_dir|-

For each embedding optimizer (Adam, SGD): two sok.Variable tables and one
sok.DynamicVariable, looked up with one sok.lookup_sparse call (sum, mean,
mean; SparseTensor and RaggedTensor ids), a Dense layer on top, trained
``STEPS`` steps on this worker's slice of the global batch: dense gradients
summed over workers, SOK gradients applied by sok.OptimizerWrapper. The twin
(rank 0 of the first launch, ``previous`` ``-``: it does not depend on the
world size) trains plain tf.Variables with tf.nn.embedding_lookup_sparse on the
whole global batch. After Adam the tables and slots are dumped with sok.dump
into out_dir/dump; with a previous run's folder, fresh tables load that dump
(written on another number of workers) and their rows and slots are recorded.

Incremental dumps: with Adagrad (row-local, one slot) a full sok.dump after
step 0, sok.incremental_dump after step 2 (keys updated since the full dump,
time as UNIX seconds) and after step 3 (since the first one, as a datetime);
the next launch loads the three in order and records the tables and slots.
The Adam tables (every row moves) and the TF1 SGD graph count the keys an
incremental dump holds for a time before and after their training.
"""
import datetime
import os
import sys
import time

import numpy as np
import tensorflow as tf

import collective.sok
sys.modules["sparse_operation_kit"] = collective.sok
import sparse_operation_kit as sok  # noqa: E402  pylint: disable=wrong-import-position

from collective import comm  # noqa: E402  pylint: disable=wrong-import-position
from collective.embedding.table import shard_of  # noqa: E402  pylint: disable=wrong-import-position
import sok_v2_cases as cases  # noqa: E402  pylint: disable=wrong-import-position

tf.keras.backend.set_floatx("float64")
out_dir, previous = sys.argv[1], sys.argv[2]
sok.init()
rank, n = comm.rank(), comm.world_size()
local = cases.GLOBAL_BATCH // n
results = {}


def make_tables(tag):
    init = cases.initial_tables()
    a = sok.Variable(init["a"], dtype=tf.float64, name=f"{tag}_a")
    rows, dim = cases.TABLES["b"]
    b = sok.Variable(shape=[rows, dim], initializer=tf.keras.initializers.Constant(init["b"]), dtype=tf.float64,
                     name=f"{tag}_b", mode="distributed")
    c = sok.DynamicVariable(dimension=cases.DIM_C, initializer=cases.INIT_C, var_type="hbm", key_type=tf.int64,
                            dtype=tf.float64, name=f"{tag}_c", init_capacity=64)
    return [a, b, c]


def logical(var, table=None):
    """(global keys, rows) this worker holds of ``var`` (or of its slot ``table``)."""
    info = shard_of(var)
    table = var if table is None else table
    if info.hash_index is None:
        return info.layout.global_row(tf.range(info.local_rows, dtype=tf.int64)).numpy(), table.numpy()
    keys, rows = info.hash_index.entries()
    return keys.numpy(), tf.gather(table, rows).numpy()


def record(prefix, variables, wrapper=None):
    for name, var in zip("abc", variables):
        keys, values = logical(var)
        results[f"{prefix}/{name}/keys"], results[f"{prefix}/{name}/values"] = keys, values
        for slot, table in (wrapper.slots(var).items() if wrapper else ()):
            results[f"{prefix}/{name}/slot_{slot}"] = logical(var, table)[1]


def inputs(step, lo, hi):
    ids, labels = cases.batch(step)
    a = tf.ragged.constant([ids["a"][i] for i in range(lo, hi)], dtype=tf.int64, ragged_rank=1,
                           inner_shape=()).with_row_splits_dtype(tf.int64)
    sparse = {k: tf.ragged.constant([ids[k][i] for i in range(lo, hi)], dtype=tf.int64).to_sparse() for k in "bc"}
    return [a, sparse["b"], sparse["c"]], tf.constant(labels[lo:hi])


OPTIMIZERS = {"adam": lambda: tf.keras.optimizers.Adam(0.05), "sgd": lambda: tf.keras.optimizers.SGD(0.5),
              "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1)}


def train(kind, steps=cases.STEPS, after_step=None):
    """The SOK program with ``kind`` (an OPTIMIZERS key); ``after_step(s, tables, wrapper)`` runs after each step.

    Returns its tables and wrapper."""
    tables = make_tables(kind)
    make = OPTIMIZERS[kind]
    wrapper, dense_opt = sok.OptimizerWrapper(make()), make()
    w0, b0 = cases.dense_weights()
    kernel, bias = tf.Variable(w0), tf.Variable(b0)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            vectors = sok.lookup_sparse(tables, ids, combiners=list(cases.COMBINERS))
            pred = tf.matmul(tf.concat(vectors, axis=1), kernel) + bias
            loss = tf.reduce_sum(tf.square(pred - labels)) / cases.GLOBAL_BATCH
        sok_vars, other = sok.filter_variables(tables + [kernel, bias])
        grads = tape.gradient(loss, sok_vars + other)
        dense = [comm.allreduce(g, "sum") if n > 1 else g for g in grads[len(sok_vars):]]
        wrapper.apply_gradients(zip(grads[:len(sok_vars)], sok_vars))
        dense_opt.apply_gradients(zip(dense, other))
        return loss

    for s in range(steps):
        ids, labels = inputs(s, rank * local, (rank + 1) * local)
        step(ids, labels)
        if after_step is not None:
            after_step(s, tables, wrapper)
    record(kind, tables, wrapper)
    results[f"{kind}/kernel"], results[f"{kind}/bias"] = kernel.numpy(), bias.numpy()
    return tables, wrapper


def dump_incrementally(s, tables, wrapper):
    """A full dump after step 0, incremental dumps after steps 2 (UNIX seconds) and 3 (a datetime)."""
    folder = os.path.join(out_dir, "inc")
    if s == 0:
        sok.dump(os.path.join(folder, "full"), tables, wrapper)
        results["since"] = np.array(time.time())
    elif s in (2, 3):
        since = float(results["since"]) if s == 2 else datetime.datetime.fromtimestamp(float(results["since"]))
        counts = sok.incremental_dump(os.path.join(folder, f"after{s}"), since, tables, wrapper)
        results[f"inc_counts/after{s}"] = np.array(list(counts.values()))  # in the order of tables
        results["since"] = np.array(time.time())


def twin_loss(tables, sparse_ids, kernel, bias, labels):
    """The plain-TensorFlow model's loss on the global batch (eager or graph): one lookup per table."""
    vectors = [tf.nn.embedding_lookup_sparse(t, sp, None, combiner=c)
               for t, sp, c in zip(tables, sparse_ids, cases.COMBINERS)]
    vectors = [tf.pad(v, [[0, cases.GLOBAL_BATCH - tf.shape(v)[0]], [0, 0]]) for v in vectors]
    pred = tf.matmul(tf.concat(vectors, axis=1), kernel) + bias
    return tf.reduce_sum(tf.square(pred - labels)) / cases.GLOBAL_BATCH


def twin(kind):
    """Plain TensorFlow on the global batch: one table per SOK variable, C indexed by position in KEYS_C."""
    init = cases.initial_tables()
    tables = [tf.Variable(init["a"]), tf.Variable(init["b"]),
              tf.Variable(np.full([len(cases.KEYS_C), cases.DIM_C], cases.INIT_C))]
    make = (lambda: tf.keras.optimizers.Adam(0.05)) if kind == "adam" else (lambda: tf.keras.optimizers.SGD(0.5))
    emb_opt, dense_opt = make(), make()
    w0, b0 = cases.dense_weights()
    kernel, bias = tf.Variable(w0), tf.Variable(b0)
    position = {int(k): i for i, k in enumerate(cases.KEYS_C)}
    for s in range(cases.STEPS):
        ids, labels = cases.batch(s)
        ids["c"] = [[position[int(k)] for k in row] for row in ids["c"]]
        sparse = [tf.ragged.constant(ids[k], dtype=tf.int64, ragged_rank=1).to_sparse() for k in "abc"]
        with tf.GradientTape() as tape:
            loss = twin_loss(tables, sparse, kernel, bias, labels)
        grads = tape.gradient(loss, tables + [kernel, bias])
        emb_opt.apply_gradients(zip(grads[:3], tables))
        dense_opt.apply_gradients(zip(grads[3:], [kernel, bias]))
    for name, t in zip("abc", tables):
        results[f"twin_{kind}/{name}"] = t.numpy()
    results[f"twin_{kind}/kernel"], results[f"twin_{kind}/bias"] = kernel.numpy(), bias.numpy()


def error_of(fn):
    try:
        fn()
    except Exception as err:  # pylint: disable=broad-except
        return f"{type(err).__name__}: {err}"
    return ""


began = time.time()
adam_tables, adam_wrapper = train("adam")
# Adam moves every row at each step: every key counts as updated since training began, none since it ended.
results["adam_inc_counts"] = np.array([list(sok.incremental_dump(
    os.path.join(out_dir, f"adam_inc_{name}"), since, adam_tables, adam_wrapper).values())
    for name, since in (("began", began), ("ended", time.time()))])
train("sgd")
train("adagrad", steps=4, after_step=dump_incrementally)
TWINS = rank == 0 and previous == "-"  # the twins train on the global batch: one launch computes them for all
if TWINS:
    twin("adam")
    twin("sgd")
sok.dump(os.path.join(out_dir, "dump"), adam_tables, adam_wrapper)
if previous != "-":
    loaded = make_tables("adam")  # the names the dump was written under
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.05))
    wrapper.optimizer.build(loaded)
    sok.load(os.path.join(previous, "dump"), loaded, wrapper)
    record("loaded", loaded, wrapper)
    # The previous launch's full dump, then its incremental dumps in order.
    loaded = make_tables("adagrad")
    wrapper = sok.OptimizerWrapper(OPTIMIZERS["adagrad"]())
    wrapper.optimizer.build(loaded)
    for name in ("full", "after2", "after3"):
        sok.load(os.path.join(previous, "inc", name), loaded, wrapper)
    record("inc_loaded", loaded, wrapper)

bad_ids, _ = inputs(0, 0, cases.GLOBAL_BATCH)
results["error/combiner"] = np.array(error_of(
    lambda: sok.lookup_sparse(adam_tables, bad_ids, combiners=["sum", "max", "mean"])))
out_of_range = tf.SparseTensor([[0, 0]], tf.constant([cases.TABLES["a"][0]], tf.int64), [1, 1])
results["error/range"] = np.array(error_of(
    lambda: sok.lookup_sparse(adam_tables[:1], [out_of_range], combiners=["sum"])))
results["error/localized"] = np.array(error_of(lambda: sok.Variable(np.ones([4, 2]), mode="localized:0")))


def tf1_phase():
    """The same program and twin as TF1 graphs run by a Session, with tf.compat.v1.train optimizers."""
    tf.compat.v1.disable_v2_behavior()
    v1 = tf.compat.v1
    for kind in ("adam", "sgd"):
        make = (lambda: v1.train.AdamOptimizer(0.05)) if kind == "adam" else \
            (lambda: v1.train.GradientDescentOptimizer(0.5))
        with tf.Graph().as_default():
            tables = make_tables(f"tf1_{kind}")
            wrapper, dense_opt = sok.OptimizerWrapper(make()), make()
            w0, b0 = cases.dense_weights()
            kernel = v1.get_variable("kernel", initializer=w0, use_resource=True)
            bias = v1.get_variable("bias", initializer=b0, use_resource=True)
            labels = v1.placeholder(tf.float64, [None, 1])
            ids = [v1.sparse_placeholder(tf.int64, [None, None]) for _ in range(3)]
            vectors = sok.lookup_sparse(tables, ids, combiners=list(cases.COMBINERS))
            # The collectives of the forward lookup: one exchange serves the two sok.Variable tables.
            results[f"tf1_{kind}/lookup_collectives"] = np.array(sorted(
                op.type for op in tf.compat.v1.get_default_graph().get_operations()
                if op.type.startswith("Horovod") and op.name.startswith("sok_lookup_sparse")))
            pred = tf.matmul(tf.concat(vectors, axis=1), kernel) + bias
            loss = tf.reduce_sum(tf.square(pred - labels)) / cases.GLOBAL_BATCH
            sok_vars, other = sok.filter_variables(v1.trainable_variables())
            grads = tf.gradients(loss, sok_vars + other)
            dense = [comm.allreduce(tf.convert_to_tensor(g), "sum") if n > 1 else g for g in grads[len(sok_vars):]]
            train_op = tf.group(wrapper.apply_gradients(zip(grads[:len(sok_vars)], sok_vars)),
                                dense_opt.apply_gradients(zip(dense, other)))
            dump_op = sok.dump(os.path.join(out_dir, "dump_tf1"), tables, wrapper)
            since = v1.placeholder(tf.float64, [])
            inc_counts = sok.incremental_dump(os.path.join(out_dir, "inc_tf1", kind), since, tables, wrapper)
            with v1.Session() as sess:
                sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
                for s in range(cases.STEPS):
                    batch, y = cases.batch(s)
                    lo, hi = rank * local, (rank + 1) * local
                    feed = {labels: y[lo:hi]}
                    for k, ph in zip("abc", ids):
                        feed[ph] = _feed_value(batch[k][lo:hi])
                    sess.run(train_op, feed)
                sess.run(dump_op)
                results[f"tf1_{kind}/inc_counts"] = np.array([
                    [sess.run(inc_counts, {since: t})[k] for k in inc_counts] for t in (0.0, time.time())])
                for name, var in zip("abc", tables):
                    info = shard_of(var)
                    if info.hash_index is None:
                        keys = info.layout.global_row(tf.range(info.local_rows, dtype=tf.int64))
                        values = tf.convert_to_tensor(var)
                    else:
                        keys, rows = info.hash_index.entries()
                        values = tf.gather(var, rows)
                    results[f"tf1_{kind}/{name}/keys"], results[f"tf1_{kind}/{name}/values"] = \
                        sess.run([keys, values])
                results[f"tf1_{kind}/kernel"], results[f"tf1_{kind}/bias"] = sess.run([kernel, bias])
        if TWINS:
            tf1_twin(kind, make)


def _feed_value(rows):
    return tf.compat.v1.SparseTensorValue([[i, j] for i, r in enumerate(rows) for j in range(len(r))],
                                          np.array([x for r in rows for x in r], np.int64).reshape(-1),
                                          [len(rows), max(1, max(len(r) for r in rows))])


def tf1_twin(kind, make):
    """:func:`twin` as a TF1 graph with the TF1 optimizers."""
    v1 = tf.compat.v1
    init = cases.initial_tables()
    position = {int(k): i for i, k in enumerate(cases.KEYS_C)}
    with tf.Graph().as_default():
        tables = [v1.get_variable(f"twin_{k}", initializer=init[k], use_resource=True) for k in "ab"]
        tables.append(v1.get_variable("twin_c", initializer=np.full([len(cases.KEYS_C), cases.DIM_C], cases.INIT_C),
                                      use_resource=True))
        w0, b0 = cases.dense_weights()
        kernel = v1.get_variable("kernel", initializer=w0, use_resource=True)
        bias = v1.get_variable("bias", initializer=b0, use_resource=True)
        labels = v1.placeholder(tf.float64, [None, 1])
        ids = [v1.sparse_placeholder(tf.int64, [None, None]) for _ in range(3)]
        loss = twin_loss(tables, ids, kernel, bias, labels)
        grads = tf.gradients(loss, tables + [kernel, bias])
        train_op = tf.group(make().apply_gradients(zip(grads[:3], tables)),
                            make().apply_gradients(zip(grads[3:], [kernel, bias])))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for s in range(cases.STEPS):
                batch, y = cases.batch(s)
                batch["c"] = [[position[int(k)] for k in row] for row in batch["c"]]
                feed = {labels: y, **{ph: _feed_value(batch[k]) for k, ph in zip("abc", ids)}}
                sess.run(train_op, feed)
            for name, t in zip("abc", tables):
                results[f"twin_tf1_{kind}/{name}"] = sess.run(t)
            results[f"twin_tf1_{kind}/kernel"], results[f"twin_tf1_{kind}/bias"] = sess.run([kernel, bias])


np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
tf1_phase()
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
