"""Data, dense weights and the single-process reference for the SOK recipe tests.

The recipes (reference/sok-get-started.md) run in tests/recipes/sok_tf2.py (Horovod,
TF2) and tests/recipes/sok_tf1.py (TensorFlow 1.15 graph); the reference here trains the
same DemoModel in one process on every global batch, with
``tf.nn.embedding_lookup`` on a whole table that holds one row per key.

The recipes keep SOK's default ``use_hashtable=True``: keys are arbitrary int64
values (negative, ``INT64_MIN``, ``INT64_MAX`` among them), and a key's first
vector is a function of the key (:mod:`collective.embedding.key_init`), so the
reference table starts from the same vectors.
"""

import functools

import numpy as np
import tensorflow as tf

from collective.embedding import key_init

VOCAB_PER_GPU, SLOT_NUM, NNZ, DIM, DENSE_LAYERS, UNITS = 1024, 10, 5, 16, 2, 1024
GLOBAL_BATCH, STEPS, MAX_WORKERS = 12, 20, 3
LEARNING_RATE = 0.1  # the recipe's
# float32 only: at 0.1 this 1024-wide model diverges and float summation order alone (one process, the batch
# summed in two halves) moves weights by 0.6 after 20 steps; at 0.01 by 2e-2 (ReLUs flip, Adam amplifies).
FLOAT32_LEARNING_RATE = 0.01
TOLERANCE = {"float64": dict(rtol=1e-5, atol=1e-5), "float32": None}

KEY_POOL = np.concatenate([
    np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0, 3, 2 ** 62], np.int64),
    np.random.default_rng(5).integers(-2 ** 63, 2 ** 63 - 1, 994, dtype=np.int64)])
"""The 1000 distinct keys the data draws from (fits one worker's 1024 rows)."""


def learning_rate(dtype: str) -> float:
    return LEARNING_RATE if dtype == "float64" else FLOAT32_LEARNING_RATE


def key_positions(step: int) -> np.ndarray:
    """``[GLOBAL_BATCH, SLOT_NUM, NNZ]`` positions in KEY_POOL of one global batch's keys."""
    rng = np.random.default_rng(1000 + step)
    positions = rng.integers(0, len(KEY_POOL), (GLOBAL_BATCH, SLOT_NUM, NNZ))
    positions[:, 0, 0] = 4  # key 3 in every sample on every worker
    return positions


def labels_of(step: int) -> np.ndarray:
    return np.random.default_rng(2000 + step).integers(0, 2, (GLOBAL_BATCH, 1)).astype(np.float32)


def global_batch(step: int):
    """Keys (int64 values) and labels of one global batch."""
    return KEY_POOL[key_positions(step)], labels_of(step)


def local_batch(step: int, rank: int, size: int):
    """This worker's rows of the global batch: ``GLOBAL_BATCH / size`` consecutive samples."""
    keys, labels = global_batch(step)
    per = GLOBAL_BATCH // size
    return keys[rank * per:(rank + 1) * per], labels[rank * per:(rank + 1) * per]


def dense_weights(shapes, dtype="float32"):
    rng = np.random.default_rng(11)
    return [rng.normal(0, 0.05, s).astype(dtype) for s in shapes]


def set_dense_weights(layers) -> None:
    """Fixed initial weights for the Dense layers (Keras' own are random per process)."""
    variables = [v for layer in layers for v in layer.weights]
    dtype = variables[0].dtype.base_dtype.name
    for var, value in zip(variables, dense_weights([tuple(v.shape) for v in variables], dtype)):
        var.assign(value)


def first_vectors(table_name: str, dtype: str) -> np.ndarray:
    """KEY_POOL's first vectors in hash table ``table_name`` under SOK's default initializer."""
    init = key_init.KeyInitializer(tf.keras.initializers.RandomUniform(-0.05, 0.05), table_name, DIM,
                                   VOCAB_PER_GPU, tf.as_dtype(dtype))
    return init(tf.constant(KEY_POOL)).numpy()


class ReferenceModel(tf.keras.models.Model):
    """DemoModel with one whole table (a row per key of KEY_POOL) and tf.nn.embedding_lookup."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.table = tf.Variable(table, name="table")
        self.dense_layers = [tf.keras.layers.Dense(units=UNITS, activation="relu") for _ in range(DENSE_LAYERS)]
        self.out_layer = tf.keras.layers.Dense(units=1, activation=None)

    def call(self, inputs):
        hidden = tf.reshape(tf.nn.embedding_lookup(self.table, inputs), [-1, SLOT_NUM * NNZ * DIM])
        for layer in self.dense_layers:
            hidden = layer(hidden)
        return self.out_layer(hidden)


@functools.lru_cache(maxsize=None)  # runs that differ only in the worker count share one reference
def reference_training(table_name: str, dtype: str, emb_optimizer: str = "keras_adam"):
    """Losses, final table (a row per KEY_POOL key) and dense weights of one process on the global batches.

    Runs with Keras' floatx set to ``dtype``, as the recipe does (Keras optimizers keep their learning rate
    in floatx: a float32 0.1 alone moves a float64 run by 1e-4 after 20 steps).
    """
    previous = tf.keras.backend.floatx()
    tf.keras.backend.set_floatx(dtype)
    try:
        return _reference_training(table_name, dtype, emb_optimizer)
    finally:
        tf.keras.backend.set_floatx(previous)


def _reference_training(table_name: str, dtype: str, emb_optimizer: str):
    model = ReferenceModel(first_vectors(table_name, dtype))
    model(key_positions(0))
    set_dense_weights(model.dense_layers + [model.out_layer])
    lr = learning_rate(dtype)
    if emb_optimizer == "lazy_adam":
        from collective.sok import LazyAdamOptimizer  # pylint: disable=import-outside-toplevel

        emb_opt = LazyAdamOptimizer(learning_rate=lr)
    elif emb_optimizer == "legacy_adam":
        emb_opt = tf.keras.optimizers.legacy.Adam(learning_rate=lr)
    else:
        emb_opt = tf.keras.optimizers.Adam(learning_rate=lr)
    dense_opt = (tf.keras.optimizers.legacy.Adam if emb_optimizer == "legacy_adam" else tf.keras.optimizers.Adam)(
        learning_rate=lr)
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

    losses = [float(step(key_positions(i), labels_of(i).astype(dtype))) for i in range(STEPS)]
    return np.array(losses), model.table.numpy(), [v.numpy() for v in others]


def serving_keys() -> np.ndarray:
    """``[GLOBAL_BATCH, SLOT_NUM, NNZ]`` keys the exports are served: a batch drawn after training, whose first
    sample holds keys no batch had (the trained model and the export read zeros for them)."""
    keys = global_batch(STEPS)[0].copy()
    keys[0] = 10 ** 12 + np.arange(SLOT_NUM * NNZ).reshape(SLOT_NUM, NNZ)
    assert not np.isin(keys[0], KEY_POOL).any()
    return keys


def seen_keys() -> np.ndarray:
    """Every key the training batches hold (the keys the hash tables must hold after training)."""
    return np.unique(np.concatenate([global_batch(step)[0].ravel() for step in range(STEPS)]))


# ---------------------------------------------------------------- the lookup cases (use_hashtable=False)

def table_values() -> np.ndarray:
    """A fixed logical table for up to MAX_WORKERS workers, for the ``use_hashtable=False`` lookups."""
    return np.random.default_rng(7).uniform(-0.05, 0.05, (VOCAB_PER_GPU * MAX_WORKERS, DIM)).astype(np.float32)


def index_keys(rank: int, size: int) -> np.ndarray:
    """``[batch, slot, nnz]`` keys in ``[0, VOCAB_PER_GPU)`` for the ``use_hashtable=False`` lookups."""
    return key_positions(0)[rank * (GLOBAL_BATCH // size):(rank + 1) * (GLOBAL_BATCH // size)].astype(np.int64)


def sparse_keys(keys: np.ndarray) -> tf.SparseTensor:
    """``[batch, slot, nnz]`` keys as DistributedEmbedding's SparseTensor ``[batch * slot, nnz]``; keys divisible
    by 7 are dropped, so slots have 0..nnz keys (some none)."""
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
