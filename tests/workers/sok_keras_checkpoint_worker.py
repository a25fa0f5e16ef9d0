"""Keras checkpoints of SOK tables: saved on one world size, restored on another.

argv: save|restore out_dir checkpoint_dir

The model holds every kind of SOK table: v1 ``All2AllDenseEmbedding`` with a
fixed vocabulary (``fixed``) and a hash table (``hashed``), a v1
``DistributedEmbedding`` with a hash table (``pooled``), a SOK v2
``sok.Variable`` (``var``) and ``sok.DynamicVariable`` (``dyn``), and a Dense
layer. Hash keys are wide int64 values, negatives included.

The SOK tables train with optimizers that have slots, through
``sok.OptimizerWrapper``: Keras Adam for ``fixed``, ``hashed``, ``pooled``,
legacy Keras Adagrad for ``var`` and ``dyn`` (the Dense layer with SGD). The
loss is the global batch's mean (each worker's sum over the global batch
size), so every world size trains the same step.

``save`` (run on 2 workers): trains two steps, records every worker's rows
and slot rows (``ckpt`` stage) and writes ``tf.train.Checkpoint(model=...,
adam=..., adagrad=...)``; trains one more step (batch 2), records (``weights``)
and writes ``model.save_weights``. Every worker saves, to ``sok.checkpoint_path(prefix)``.

``restore`` (run on 3 workers): (a) a model trained on other keys first
(its rows recorded as ``before``) reads the ``tf.train.Checkpoint``;
(b) a new, unbuilt model ``load_weights`` the other file and is built by its
first call (a deferred restore); (c) a new model with new optimizers reads
the ``tf.train.Checkpoint`` before anything exists (tables restore when built,
slots when the first step makes them) and trains batch 2 (``resumed``: the
save run's ``weights`` stage). (a) and (b) record lookups of the save run's
first batch (``training=False``).

Each worker writes ``out_dir/rank<r>.npz``: per stage and table ``<stage>_<table>_keys`` /
``_vectors`` (the logical keys it holds and their vectors), ``_slot_<slot>``
(the slot's rows of those keys) and, for hash tables, ``_slot_<slot>_free``
(the distinct values of the slot's rows no key holds); the Dense kernel.
"""
import os
import sys

import numpy as np
import tensorflow as tf

import collective.sok as sok
import horovod.tensorflow as hvd  # noqa: E402  pylint: disable=wrong-import-position
from collective.embedding.table import shard_of  # noqa: E402  pylint: disable=wrong-import-position

mode, out_dir, ckpt_dir = sys.argv[1], sys.argv[2], sys.argv[3]
hvd.init()
sok.init()
rank, n = hvd.rank(), hvd.size()

FIXED_PER_WORKER = 6  # logical rows: 12 on 2 workers, 18 on 3
CAPACITY = 32
ROWS = 10  # the sok.Variable's rows
GLOBAL_BATCH = 6
KEY_POOL = np.concatenate([np.random.default_rng(5).integers(-2 ** 62, 2 ** 62, 12), [-7, -1, 0, 3, 2 ** 40 + 1]])
TABLES = ("fixed", "hashed", "pooled", "var", "dyn")


def global_batch(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"fixed": rng.integers(0, 2 * FIXED_PER_WORKER, [GLOBAL_BATCH, 1, 2]),
            "hashed": rng.choice(KEY_POOL, [GLOBAL_BATCH, 1, 2]),
            "pooled": rng.choice(KEY_POOL, [GLOBAL_BATCH, 2]),
            "var": rng.integers(0, ROWS, [GLOBAL_BATCH, 2]),
            "dyn": rng.choice(KEY_POOL, [GLOBAL_BATCH, 2]),
            "labels": rng.normal(size=[GLOBAL_BATCH, 1]).astype(np.float32)}


def local_batch(data: dict) -> dict:
    per = GLOBAL_BATCH // n
    return {k: v[rank * per:(rank + 1) * per] for k, v in data.items()}


def _sparse(keys) -> tf.SparseTensor:
    """Every key of the ``[samples, 2]`` matrix as a SparseTensor (key 0 included)."""
    keys = tf.convert_to_tensor(keys, tf.int64)
    return tf.SparseTensor(tf.where(tf.ones_like(keys, tf.bool)), tf.reshape(keys, [-1]),
                           tf.shape(keys, out_type=tf.int64))


class Model(tf.keras.Model):
    """Every kind of SOK table and a Dense layer on their concatenated vectors."""

    def __init__(self):
        # Fixed names: a hash table's new key starts from a vector seeded by the table's name, so every model
        # (the save run's, the resumed one) gives a key inserted by the same step the same first vector.
        super().__init__(name="sok_model")
        self.fixed = sok.All2AllDenseEmbedding(FIXED_PER_WORKER, 4, slot_num=1, nnz_per_slot=2, use_hashtable=False,
                                               name="fixed")
        self.hashed = sok.All2AllDenseEmbedding(CAPACITY, 4, slot_num=1, nnz_per_slot=2, use_hashtable=True,
                                                name="hashed")
        self.pooled = sok.DistributedEmbedding("sum", CAPACITY, 3, slot_num=1, max_nnz=2, use_hashtable=True,
                                               name="pooled")
        self.var = sok.Variable(np.random.default_rng(1).uniform(-1, 1, [ROWS, 2]).astype(np.float32), name="var")
        self.dyn = sok.DynamicVariable(dimension=3, initializer="random", key_type=tf.int64, init_capacity=CAPACITY,
                                       name="dyn")
        self.dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(0.1))

    def embed(self, data: dict, training=True) -> dict:
        var, dyn = sok.lookup_sparse([self.var, self.dyn], [tf.RaggedTensor.from_tensor(data["var"]),
                                                            tf.RaggedTensor.from_tensor(data["dyn"])],
                                     combiners=["sum", "sum"])
        return {"fixed": self.fixed(data["fixed"], training=training),
                "hashed": self.hashed(data["hashed"], training=training),
                "pooled": self.pooled(_sparse(data["pooled"]), training=training), "var": var, "dyn": dyn}

    def call(self, data, training=True):
        vectors = self.embed(data, training)
        batch = tf.shape(data["labels"])[0]
        return self.dense(tf.concat([tf.reshape(vectors[k], [batch, -1]) for k in TABLES], axis=1))


ADAM_TABLES = ("fixed", "hashed", "pooled")  # the others train with Adagrad


def optimizers() -> dict:
    """The SOK tables' optimizers (both with slots) and the Dense layer's."""
    return {"adam": sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.05)),
            "adagrad": sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adagrad(0.1)),
            "dense": tf.keras.optimizers.SGD(0.5)}


def checkpoint(model: Model, opts: dict) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(model=model, adam=opts["adam"].optimizer, adagrad=opts["adagrad"].optimizer)


def train(model: Model, opts: dict, seed: int) -> None:
    data = local_batch(global_batch(seed))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(model(data) - data["labels"])) / GLOBAL_BATCH
    sok_vars, other = sok.filter_variables(model.trainable_variables)
    grads = tape.gradient(loss, sok_vars + other)
    grad_of = {id(v): g for v, g in zip(sok_vars, grads)}
    for opt, names in (("adam", ADAM_TABLES), ("adagrad", ("var", "dyn"))):
        opts[opt].apply_gradients([(grad_of[id(tables(model)[name])], tables(model)[name]) for name in names])
    dense = [hvd.allreduce(g, op=hvd.Sum) for g in grads[len(sok_vars):]]
    opts["dense"].apply_gradients(zip(dense, other))


def tables(model: Model) -> dict:
    return {"fixed": model.fixed.embedding_variable, "hashed": model.hashed.embedding_variable,
            "pooled": model.pooled.embedding_variable, "var": model.var, "dyn": model.dyn}


def record(results: dict, stage: str, model: Model, opts: dict = None) -> None:
    """This worker's logical keys and their vectors (and slot rows) of every table, and the Dense kernel."""
    for name, var in tables(model).items():
        info = shard_of(var)
        if info.hash_index is None:
            keys, rows = np.arange(var.shape[0]) * n + rank, np.arange(var.shape[0])
        else:
            keys, rows = (t.numpy() for t in info.hash_index.entries())
        results[f"{stage}_{name}_keys"], results[f"{stage}_{name}_vectors"] = keys, var.numpy()[rows]
        slots = opts["adam" if name in ADAM_TABLES else "adagrad"].slots(var) if opts else {}
        for slot_name, slot in slots.items():
            results[f"{stage}_{name}_slot_{slot_name}"] = slot.numpy()[rows]
            if info.hash_index is not None:
                results[f"{stage}_{name}_slot_{slot_name}_free"] = np.unique(np.delete(slot.numpy(), rows, axis=0))
    results[f"{stage}_dense"] = model.dense.kernel.numpy()


def record_lookups(results: dict, stage: str, model: Model) -> None:
    """Lookups of the save run's first batch; the first call of an unbuilt model builds (and restores) it."""
    batch = global_batch(0)
    model(batch, training=False)
    looked_up = model.embed(batch, training=False)
    for name, vectors in looked_up.items():
        results[f"{stage}_{name}_lookup"] = vectors.numpy()


results = {}
if mode == "save":
    model, opts = Model(), optimizers()
    train(model, opts, 0)
    train(model, opts, 1)
    record(results, "ckpt", model, opts)
    checkpoint(model, opts).write(sok.checkpoint_path(os.path.join(ckpt_dir, "ckpt")))
    train(model, opts, 2)
    record(results, "weights", model, opts)
    model.save_weights(sok.checkpoint_path(os.path.join(ckpt_dir, "weights")))
    batch = global_batch(0)
    results.update({f"batch_{name}": batch[name] for name in TABLES})
else:
    model, opts = Model(), optimizers()
    train(model, opts, 7)  # other keys and values: the restore must replace them
    record(results, "before", model, opts)
    checkpoint(model, opts).read(os.path.join(ckpt_dir, "ckpt")).assert_existing_objects_matched()
    record(results, "ckpt", model, opts)
    record_lookups(results, "ckpt", model)

    unbuilt = Model()
    unbuilt.load_weights(os.path.join(ckpt_dir, "weights"))
    record_lookups(results, "weights", unbuilt)
    record(results, "weights", unbuilt)

    resumed, opts = Model(), optimizers()
    checkpoint(resumed, opts).read(os.path.join(ckpt_dir, "ckpt"))  # nothing exists yet: every restore deferred
    train(resumed, opts, 2)
    record(results, "resumed", resumed, opts)
os.makedirs(out_dir, exist_ok=True)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
