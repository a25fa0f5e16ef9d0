"""Shared pieces of the sok.Saver acceptance runs: data, initial values, the SOK model and its pure-TF twin.

The model is SOK v1's DenseDemo widened to three tables: two
``All2AllDenseEmbedding`` layers (a fixed vocabulary and a hash table) and a
``DistributedEmbedding`` (sum), their vectors concatenated into two dense
layers. Its tables start from ``Saver.load_embedding_values`` (the whole
table as numpy, a list of parts, a tensor) and it trains with SGD, so one
process on the global batch trains the same numbers up to float32 rounding.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

GLOBAL_BATCH = 6
STEPS = 3
LEARNING_RATE = 0.5
# name -> (logical rows, dim, slot_num, keys per slot); "b" is the hash table (rows are its loaded keys).
TABLES = {"a": (24, 4, 2, 2), "b": (20, 4, 2, 1), "c": (30, 6, 2, 3)}
HASH_CAPACITY = 24
HIDDEN = 8


def initial_table(name: str) -> np.ndarray:
    rows, dim = TABLES[name][:2]
    return np.random.default_rng(ord(name)).uniform(-0.5, 0.5, [rows, dim]).astype(np.float32)


def dense_weights() -> List[np.ndarray]:
    width = sum(slots * nnz * dim for name, (_, dim, slots, nnz) in TABLES.items() if name != "c") \
        + TABLES["c"][2] * TABLES["c"][1]
    rng = np.random.default_rng(7)
    return [rng.normal(0, 0.3, [width, HIDDEN]).astype(np.float32), np.zeros([HIDDEN], np.float32),
            rng.normal(0, 0.3, [HIDDEN, 1]).astype(np.float32), np.zeros([1], np.float32)]


def global_batch(step: int) -> Dict[str, np.ndarray]:
    """``a``/``b``: keys ``[batch, slots, nnz]``; ``c``: ``[batch * slots, nnz]`` with -1 for no key; labels."""
    rng = np.random.default_rng(100 + step)
    batch = {}
    for name in ("a", "b"):
        rows, _, slots, nnz = TABLES[name]
        batch[name] = rng.integers(0, rows, [GLOBAL_BATCH, slots, nnz]).astype(np.int64)
    rows, _, slots, nnz = TABLES["c"]
    c = rng.integers(0, rows, [GLOBAL_BATCH * slots, nnz]).astype(np.int64)
    c[rng.random(c.shape) < 0.3] = -1
    c[1] = -1  # a slot without keys
    batch["c"] = c
    batch["labels"] = rng.integers(0, 2, [GLOBAL_BATCH, 1]).astype(np.float32)
    return batch


def local_batch(step: int, rank: int, n: int) -> Dict[str, np.ndarray]:
    """Worker ``rank``'s contiguous share of the global batch."""
    full, per = global_batch(step), GLOBAL_BATCH // n
    slots = TABLES["c"][2]
    out = {k: v[rank * per:(rank + 1) * per] for k, v in full.items() if k != "c"}
    out["c"] = full["c"][rank * per * slots:(rank + 1) * per * slots]
    return out


def sparse_parts(keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices, values, dense_shape) of the -1-padded key matrix."""
    at = np.argwhere(keys >= 0)
    return at.astype(np.int64), keys[keys >= 0], np.array(keys.shape, np.int64)


def reference_training() -> Tuple[np.ndarray, Dict[str, np.ndarray], List[np.ndarray]]:
    """One TensorFlow process, plain tables and ``tf.nn`` lookups, on every global batch: (losses, tables, dense)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tables = {name: tf.Variable(initial_table(name)) for name in TABLES}
    weights = [tf.Variable(w) for w in dense_weights()]
    opt = tf.keras.optimizers.SGD(LEARNING_RATE)
    losses = []
    for step in range(STEPS):
        data = global_batch(step)
        with tf.GradientTape() as tape:
            logits = forward_twin(tf, tables, weights, data)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(data["labels"], logits))
        variables = list(tables.values()) + weights
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        losses.append(float(loss))
    return np.array(losses), {k: v.numpy() for k, v in tables.items()}, [w.numpy() for w in weights]


def forward_twin(tf, tables, weights, data):
    parts = [tf.reshape(tf.nn.embedding_lookup(tables[name], data[name]), [GLOBAL_BATCH, -1]) for name in ("a", "b")]
    sparse = tf.SparseTensor(*sparse_parts(data["c"]))
    pooled = tf.nn.embedding_lookup_sparse(tables["c"], sparse, None, combiner="sum")
    pooled = tf.concat([pooled, tf.zeros([data["c"].shape[0] - tf.shape(pooled)[0], TABLES["c"][1]])], axis=0)
    parts.append(tf.reshape(pooled, [GLOBAL_BATCH, -1]))
    hidden = tf.nn.relu(tf.matmul(tf.concat(parts, axis=1), weights[0]) + weights[1])
    return tf.matmul(hidden, weights[2]) + weights[3]


def read_dump(directory, name: str, dim: int) -> Tuple[np.ndarray, np.ndarray]:
    """A Saver dump as SOK v1 writes it, read with numpy alone: (keys int64, values [keys, dim] float32)."""
    import os  # pylint: disable=import-outside-toplevel

    keys = np.fromfile(os.path.join(directory, f"{name}_keys.file"), dtype="<i8")
    values = np.fromfile(os.path.join(directory, f"{name}_values.file"), dtype="<f4").reshape(-1, dim)
    assert len(keys) == len(values), (name, len(keys), len(values))
    return keys, values
