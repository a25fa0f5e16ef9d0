"""Data, dense weights and the single-process reference for the SOK recipe tests.

The recipe (reference/sok-get-started.md, "Use SparseOperationKit with
Horovod") runs in api_sok_tf2.py; the reference here trains the same
DemoModel in one process on every global batch with ``tf.nn.embedding_lookup``
on the whole table.
"""

import numpy as np
import tensorflow as tf

VOCAB_PER_GPU, SLOT_NUM, NNZ, DIM, DENSE_LAYERS, UNITS = 1024, 10, 5, 16, 2, 1024
GLOBAL_BATCH, STEPS, MAX_WORKERS = 12, 20, 3
# The recipe's 0.1 makes this 1024-wide model diverge (losses in the hundreds), where float summation order
# alone grows into differences of 1e-1 after 20 steps; 0.01 trains it smoothly.
LEARNING_RATE = 0.01


def table_values() -> np.ndarray:
    """The logical table for up to MAX_WORKERS workers (keys stay below VOCAB_PER_GPU)."""
    return np.random.default_rng(7).uniform(-0.05, 0.05, (VOCAB_PER_GPU * MAX_WORKERS, DIM)).astype(np.float32)


def global_batch(step: int):
    rng = np.random.default_rng(1000 + step)
    keys = rng.integers(0, VOCAB_PER_GPU, (GLOBAL_BATCH, SLOT_NUM, NNZ)).astype(np.int64)
    keys[:, 0, 0] = 3  # one key every sample and worker reads
    labels = rng.integers(0, 2, (GLOBAL_BATCH, 1)).astype(np.float32)
    return keys, labels


def local_batch(step: int, rank: int, size: int):
    keys, labels = global_batch(step)
    per = GLOBAL_BATCH // size
    return keys[rank * per:(rank + 1) * per], labels[rank * per:(rank + 1) * per]


def dense_weights(shapes):
    rng = np.random.default_rng(11)
    return [rng.normal(0, 0.05, s).astype(np.float32) for s in shapes]


def set_dense_weights(layers) -> None:
    """Fixed initial weights for the Dense layers (Keras' own are random per process)."""
    variables = [v for layer in layers for v in layer.weights]
    for var, value in zip(variables, dense_weights([tuple(v.shape) for v in variables])):
        var.assign(value)


class ReferenceModel(tf.keras.models.Model):
    """DemoModel with a whole table and tf.nn.embedding_lookup."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = tf.Variable(table_values()[:vocab], name="table")
        self.dense_layers = [tf.keras.layers.Dense(units=UNITS, activation="relu") for _ in range(DENSE_LAYERS)]
        self.out_layer = tf.keras.layers.Dense(units=1, activation=None)

    def call(self, inputs):
        hidden = tf.reshape(tf.nn.embedding_lookup(self.table, inputs), [-1, SLOT_NUM * NNZ * DIM])
        for layer in self.dense_layers:
            hidden = layer(hidden)
        return self.out_layer(hidden)


def reference_training(world_size: int, emb_optimizer: str = "keras_adam"):
    """Losses, final table and dense weights of one process training on the global batches."""
    model = ReferenceModel(VOCAB_PER_GPU * world_size)
    model(global_batch(0)[0])
    set_dense_weights(model.dense_layers + [model.out_layer])
    if emb_optimizer == "lazy_adam":
        from collective.sok import LazyAdamOptimizer  # pylint: disable=import-outside-toplevel

        emb_opt = LazyAdamOptimizer(learning_rate=LEARNING_RATE)
    elif emb_optimizer == "legacy_adam":
        emb_opt = tf.keras.optimizers.legacy.Adam(learning_rate=LEARNING_RATE)
    else:
        emb_opt = tf.keras.optimizers.Adam(learning_rate=LEARNING_RATE)
    dense_opt = (tf.keras.optimizers.legacy.Adam if emb_optimizer == "legacy_adam" else tf.keras.optimizers.Adam)(
        learning_rate=LEARNING_RATE)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    others = [v for v in model.trainable_variables if v is not model.table]

    @tf.function
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(labels, model(inputs)), global_batch_size=GLOBAL_BATCH)
        emb_grad, grads = tape.gradient(loss, [model.table, others])
        emb_opt.apply_gradients([(emb_grad, model.table)])
        dense_opt.apply_gradients(zip(grads, others))
        return loss

    losses = [float(step(*global_batch(i))) for i in range(STEPS)]
    return np.array(losses), model.table.numpy(), [v.numpy() for v in others]


def sparse_keys(keys: np.ndarray) -> tf.SparseTensor:
    """``[batch, slot, nnz]`` keys as DistributedEmbedding's SparseTensor ``[batch * slot, nnz]``; key 0 is
    dropped, so slots have 0..nnz keys (some none)."""
    flat = keys.reshape(-1, keys.shape[-1])
    rows, cols = np.nonzero(flat % 7 != 0)
    return tf.SparseTensor(np.stack([rows, cols], 1).astype(np.int64), flat[rows, cols], flat.shape)


def combine_numpy(table: np.ndarray, keys: np.ndarray, combiner: str) -> np.ndarray:
    """What DistributedEmbedding gives for ``sparse_keys(keys)``: ``[batch, slot, dim]``."""
    flat = keys.reshape(-1, keys.shape[-1])
    out = np.zeros((flat.shape[0], table.shape[1]), np.float64)
    for i, row in enumerate(flat):
        kept = row[row % 7 != 0]
        if kept.size:
            out[i] = table[kept].sum(0) / (kept.size if combiner == "mean" else 1)
    return out.reshape(keys.shape[0], keys.shape[1], table.shape[1])
