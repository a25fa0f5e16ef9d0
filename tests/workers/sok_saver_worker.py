"""A SOK v1 DenseDemo-style program with sok.Saver, in TF2 (eager + tf.function) and then in TF1 graphs.

argv: out_dir previous_dir|-

``sparse_operation_kit`` resolves to ``collective.sok`` through the one
documented line. In each phase (``tf2``, then ``tf1`` after
``tf.compat.v1.disable_v2_behavior()``) the program

1. builds the model; with a previous run's folder, restores every table from
   that run's dump (written on another number of workers) and records each
   worker's rows and a lookup of its first batch;
2. loads the initial tables with ``Saver.load_embedding_values`` (numpy, a
   list of parts, a tensor), trains ``cases.STEPS`` steps with SGD and
   records losses, every worker's rows and the dense weights;
3. dumps every table into ``out_dir/<phase>/dump``.

In TF1 it also records the error of a restore from a folder without a dump.
"""
import os
import sys

import numpy as np
import tensorflow as tf

import collective.sok
sys.modules["sparse_operation_kit"] = collective.sok  # the one line: sparse_operation_kit is collective.sok
import sparse_operation_kit as sok  # noqa: E402  pylint: disable=wrong-import-position

import horovod.tensorflow as hvd  # noqa: E402  pylint: disable=wrong-import-position
import sok_saver_cases as cases  # noqa: E402  pylint: disable=wrong-import-position

out_dir, previous = sys.argv[1], sys.argv[2]
hvd.init()
rank, n = hvd.rank(), hvd.size()
NAMES = ("a", "b", "c")


class SOKDenseDemo(tf.keras.models.Model):
    """SOK's DenseDemo with two All2AllDenseEmbedding tables (fixed, hash) and one DistributedEmbedding."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        (ra, da, sa, na), (_, db, sb, nb), (rc, dc, sc, nc) = (cases.TABLES[k] for k in NAMES)
        self.embedding_layers = [
            sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=ra // n, embedding_vec_size=da, slot_num=sa,
                                      nnz_per_slot=na, use_hashtable=False),
            sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=cases.HASH_CAPACITY, embedding_vec_size=db,
                                      slot_num=sb, nnz_per_slot=nb, use_hashtable=True),
            sok.DistributedEmbedding(combiner="sum", max_vocabulary_size_per_gpu=rc // n, embedding_vec_size=dc,
                                     slot_num=sc, max_nnz=nc, use_hashtable=False)]
        w = cases.dense_weights()
        const = tf.keras.initializers.Constant
        self.hidden = tf.keras.layers.Dense(cases.HIDDEN, activation="relu", kernel_initializer=const(w[0]),
                                            bias_initializer=const(w[1]))
        self.out_layer = tf.keras.layers.Dense(1, kernel_initializer=const(w[2]), bias_initializer=const(w[3]))

    def call(self, inputs, training=True):
        vectors = [layer(keys, training=training) for layer, keys in zip(self.embedding_layers, inputs)]
        widths = [dim * slots * (nnz if k != "c" else 1) for k, (_, dim, slots, nnz) in cases.TABLES.items()]
        flat = tf.concat([tf.reshape(v, [-1, w]) for v, w in zip(vectors, widths)], axis=1)
        return self.out_layer(self.hidden(flat))


def initial_values():
    """The three forms SOK v1 takes: a whole numpy table, a list of parts (numpy and tensors), a tensor."""
    b = cases.initial_table("b")
    parts = np.array_split(b, 3)
    return [cases.initial_table("a"), [parts[0], tf.constant(parts[1]), parts[2]],
            tf.constant(cases.initial_table("c"))]


def held_rows(var):
    """(keys, vectors) this worker holds: its rows of a fixed table, the keys of a hash table."""
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    index = hash_table.table_of(var)
    if index is not None:
        keys, rows = index.entries()
        return keys, tf.gather(var, rows)
    return tf.range(tf.shape(var, out_type=tf.int64)[0]) * n + rank, tf.convert_to_tensor(var)


def save(phase: str, what: str, **arrays):
    folder = os.path.join(out_dir, phase)
    os.makedirs(folder, exist_ok=True)
    np.savez(os.path.join(folder, f"{what}{rank}.npz"), **arrays)


def inputs_of(step: int):
    """This worker's keys (the DistributedEmbedding's as (indices, values, dense_shape)) and labels."""
    local = cases.local_batch(step, rank, n)
    return local["a"], local["b"], cases.sparse_parts(local["c"]), local["labels"]


def run_tf2():
    sok.Init(global_batch_size=cases.GLOBAL_BATCH)
    model = SOKDenseDemo()
    saver = sok.Saver()
    variables = [layer.embedding_variable for layer in model.embedding_layers]
    names = [v.m_var_name for v in variables]
    if previous != "-":
        for var in variables:
            saver.restore_from_file(var, os.path.join(previous, "tf2", "dump"))
        a, b, c, _ = inputs_of(0)
        looked = [layer(keys, training=False).numpy()
                  for layer, keys in zip(model.embedding_layers, (a, b, tf.SparseTensor(*c)))]
        save("tf2", "restored", **{f"{k}_keys": held_rows(v)[0].numpy() for k, v in zip(NAMES, variables)},
             **{f"{k}_vectors": held_rows(v)[1].numpy() for k, v in zip(NAMES, variables)},
             **{f"{k}_lookup": x for k, x in zip(NAMES, looked)})
    for var, value in zip(variables, initial_values()):
        saver.load_embedding_values(var, value)

    emb_opt = tf.keras.optimizers.SGD(learning_rate=cases.LEARNING_RATE)
    dense_opt = tf.keras.optimizers.SGD(learning_rate=cases.LEARNING_RATE)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    @tf.function
    def train_step(a, b, c, labels):
        with tf.GradientTape() as tape:
            logits = model([a, b, c], training=True)
            loss = tf.nn.compute_average_loss(loss_fn(labels, logits), global_batch_size=cases.GLOBAL_BATCH)
        emb_vars, other_vars = sok.split_embedding_variable_from_others(model.trainable_variables)
        emb_grads, other_grads = tape.gradient(loss, [emb_vars, other_vars])
        with sok.OptimizerScope(emb_vars):
            emb_opt.apply_gradients(zip(emb_grads, emb_vars), experimental_aggregate_gradients=False)
        if n > 1:
            other_grads = [hvd.allreduce(g, op=hvd.Sum) for g in other_grads]
        dense_opt.apply_gradients(zip(other_grads, other_vars))
        return hvd.allreduce(loss, op=hvd.Sum) if n > 1 else loss

    losses = []
    for step in range(cases.STEPS):
        a, b, c, y = inputs_of(step)
        losses.append(float(train_step(a, b, tf.SparseTensor(*c), y)))
    dump = os.path.join(out_dir, "tf2", "dump")
    statuses = [saver.dump_to_file(var, dump).numpy() for var in variables]
    assert statuses == [b"OK"] * 3, statuses
    _, others = sok.split_embedding_variable_from_others(model.trainable_variables)
    save("tf2", "trained", losses=np.array(losses), names=np.array(names),
         **{f"{k}_keys": held_rows(v)[0].numpy() for k, v in zip(NAMES, variables)},
         **{f"{k}_vectors": held_rows(v)[1].numpy() for k, v in zip(NAMES, variables)},
         **{f"dense{i}": v.numpy() for i, v in enumerate(others)})


def run_tf1():
    tf.compat.v1.disable_v2_behavior()
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        sok_init = sok.Init(global_batch_size=cases.GLOBAL_BATCH)
        model = SOKDenseDemo()
        saver = sok.Saver()
        variables = [layer.embedding_variable for layer in model.embedding_layers]
        names = [v.m_var_name for v in variables]
        a_in = v1.placeholder(tf.int64, [None] + list(cases.TABLES["a"][2:]))
        b_in = v1.placeholder(tf.int64, [None] + list(cases.TABLES["b"][2:]))
        c_in = v1.sparse_placeholder(tf.int64, [None, cases.TABLES["c"][3]])
        labels = v1.placeholder(tf.float32, [None, 1])
        logits = model([a_in, b_in, c_in], training=True)
        loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
        loss = tf.nn.compute_average_loss(loss_fn(labels, logits), global_batch_size=cases.GLOBAL_BATCH)
        emb_vars, other_vars = sok.split_embedding_variable_from_others(model.trainable_variables)
        grads = tf.gradients(loss, list(emb_vars) + list(other_vars))
        emb_grads, other_grads = grads[:len(emb_vars)], grads[len(emb_vars):]
        emb_opt = tf.keras.optimizers.legacy.SGD(learning_rate=cases.LEARNING_RATE)
        dense_opt = tf.keras.optimizers.legacy.SGD(learning_rate=cases.LEARNING_RATE)
        with sok.OptimizerScope(emb_vars):
            emb_train = emb_opt.apply_gradients(zip(emb_grads, emb_vars))
        if n > 1:
            other_grads = [hvd.allreduce(g, op=hvd.Sum) for g in other_grads]
        dense_train = dense_opt.apply_gradients(zip(other_grads, other_vars))
        with tf.control_dependencies([emb_train, dense_train]):
            total = hvd.allreduce(loss, op=hvd.Sum) if n > 1 else tf.identity(loss)

        restore_ops = [saver.restore_from_file(var, os.path.join(previous, "tf1", "dump")) for var in variables] \
            if previous != "-" else []
        load_ops = [saver.load_embedding_values(var, value) for var, value in zip(variables, initial_values())]
        dump_ops = [saver.dump_to_file(var, os.path.join(out_dir, "tf1", "dump")) for var in variables]
        missing = saver.restore_from_file(variables[0], os.path.join(out_dir, "tf1", "no_dump_here"))
        a_look, b_look, c_look = (layer(x, training=False) for layer, x in zip(model.embedding_layers,
                                                                                 (a_in, b_in, c_in)))
        held = [held_rows(v) for v in variables]

        def feed(step):
            a, b, c, y = inputs_of(step)
            return {a_in: a, b_in: b, c_in: v1.SparseTensorValue(*c), labels: y}

        with v1.Session() as sess:
            sess.run(sok_init)
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            if restore_ops:
                assert all(s == b"OK" for s in sess.run(restore_ops))
                looked = sess.run([a_look, b_look, c_look], feed(0))
                got = sess.run(held)
                save("tf1", "restored", **{f"{k}_keys": h[0] for k, h in zip(NAMES, got)},
                     **{f"{k}_vectors": h[1] for k, h in zip(NAMES, got)},
                     **{f"{k}_lookup": x for k, x in zip(NAMES, looked)})
            sess.run(load_ops)
            losses = [sess.run(total, feed(step)) for step in range(cases.STEPS)]
            assert sess.run(dump_ops) == [b"OK"] * 3
            try:
                sess.run(missing)
                error = ""
            except tf.errors.OpError as err:
                error = err.message
            got, dense = sess.run(held), sess.run(list(other_vars))
    save("tf1", "trained", losses=np.array(losses), names=np.array(names), missing_error=np.array(error),
         **{f"{k}_keys": h[0] for k, h in zip(NAMES, got)}, **{f"{k}_vectors": h[1] for k, h in zip(NAMES, got)},
         **{f"dense{i}": v for i, v in enumerate(dense)})


run_tf2()
run_tf1()
print("done", rank)
