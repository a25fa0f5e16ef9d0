"""The checkpoint tests' model: embedding_cases' two tables and dense layer, trained with Adam.

Workers build it inside ``CollectiveStrategy`` and feed their share of each
global batch; the tests build it in plain single-process TensorFlow on the
whole batch (the uninterrupted reference) and compare checkpoints.
"""

import contextlib

import numpy as np
import tensorflow as tf

try:
    import embedding_cases as cases  # a worker: tests/workers is on sys.path
except ImportError:
    from workers import embedding_cases as cases

OPTIMIZER = "Adam"
# Every key the model saves: the tables and their Adam slots are sharded, the rest replicated.
TABLE_KEYS = ("t1", "t1/Adam", "t1/Adam_1", "t2", "t2/Adam", "t2/Adam_1")
DENSE_KEYS = ("w", "w/Adam", "w/Adam_1", "b", "b/Adam", "b/Adam_1", "beta1_power", "beta2_power", "global_step")


def build(strategy=None):
    """The model with a global step: returns (loss, train_op, feed)."""
    loss, train_op, _, _, feed = cases.build_training(OPTIMIZER, strategy)
    step = tf.compat.v1.train.get_or_create_global_step()
    with tf.control_dependencies([train_op]):
        train = step.assign_add(1)
    return loss, train, feed


def reference(steps: int) -> dict:
    """Every checkpoint key after ``steps`` steps of one process on the global batches."""
    with tf.Graph().as_default():
        _, train, feed = build()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                sess.run(train, feed(cases.global_batch(step)))
            return {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}


def read_checkpoint(path: str) -> dict:
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    return {key: reader.get_tensor(key) for key in TABLE_KEYS + DENSE_KEYS}


def assert_checkpoint_equals(path: str, expected: dict, what: str = "") -> None:
    """The checkpoint at ``path`` holds ``expected``'s whole tables and dense variables."""
    got = read_checkpoint(path)
    for key in TABLE_KEYS + DENSE_KEYS:
        np.testing.assert_allclose(got[key], expected[key], rtol=2e-4, atol=1e-6, err_msg=f"{what} {path}: {key}")


def forward(ids, sp, weights, strategy=None):
    """The model's logits from dense serving inputs (the variables and ops of ``build``).

    ``ids`` [B, 2] int64 for t1; ``sp`` [B, 3] int64 ids for t2 padded with
    -1, ``weights`` [B, 3] their weights (mean combiner).
    """
    scope = strategy.embedding_scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        t1 = tf.compat.v1.get_variable("t1", [cases.VOCAB, cases.DIM])
        t2 = tf.compat.v1.get_variable("t2", [cases.VOCAB, cases.DIM])
    at = tf.where(sp >= 0)
    shape = tf.shape(sp, out_type=tf.int64)
    sp_ids = tf.SparseTensor(at, tf.gather_nd(sp, at), shape)
    sp_weights = tf.SparseTensor(at, tf.gather_nd(weights, at), shape)
    e1 = tf.reshape(tf.nn.embedding_lookup(t1, ids), [-1, 2 * cases.DIM])
    e2 = tf.nn.embedding_lookup_sparse(t2, sp_ids, sp_weights, combiner="mean")
    w = tf.compat.v1.get_variable("w", [3 * cases.DIM, 1])
    b = tf.compat.v1.get_variable("b", [1])
    return tf.matmul(tf.nn.relu(tf.concat([e1, e2], 1)), w) + b


def serving_inputs(step: int = 7):
    """A global batch as the dense serving inputs of :func:`forward`: {ids, sp, weights}."""
    dense, (rows, ids, weights), _ = cases.global_batch(step)
    sp = -np.ones((len(dense), 3), np.int64)
    w = np.zeros((len(dense), 3), np.float32)
    for row in range(len(dense)):
        sp[row, :(rows == row).sum()] = ids[rows == row]
        w[row, :(rows == row).sum()] = weights[rows == row]
    return {"ids": dense.astype(np.int64), "sp": sp, "weights": w}


# ---------------------------------------------------------------- a hash-table vocabulary

HASH_KEYS = np.array([-7, 3, 10 ** 12, -(2 ** 40), 5, 17, 2 ** 62, 11, 0, -1, 42, 99], np.int64)


def hash_batch(step: int):
    """Keys [B, 2] (negative and huge ones included) and targets [B, 1] of one global batch."""
    rng = np.random.default_rng(500 + step)
    keys = rng.choice(HASH_KEYS[: 6 + 2 * step], size=(cases.BATCH, 2))  # new keys appear at every step
    return keys, rng.normal(size=(cases.BATCH, 1)).astype(np.float32)


def hash_forward(keys, strategy):
    """The hash model's prediction [B, 1] for keys [B, 2]."""
    from collective.embedding.hash_table import hash_embedding_variable  # pylint: disable=import-outside-toplevel

    with strategy.embedding_scope():
        table = hash_embedding_variable("item", dim=3, capacity_per_worker=32,
                                        initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5))
    return tf.reduce_sum(tf.nn.embedding_lookup(table, keys), axis=[1, 2])[:, None]


def build_hash(strategy):
    """A hash-table model trained with Adagrad: returns (train, feed(step, rank, size))."""
    keys = tf.compat.v1.placeholder(tf.int64, [None, 2])
    targets = tf.compat.v1.placeholder(tf.float32, [None, 1])
    prediction = hash_forward(keys, strategy)
    loss = tf.reduce_mean(tf.square(prediction - targets))
    train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss)
    step = tf.compat.v1.train.get_or_create_global_step()
    with tf.control_dependencies([train_op]):
        train = step.assign_add(1)

    def feed(step_index, rank, size):
        all_keys, all_targets = hash_batch(step_index)
        per = cases.BATCH // size
        return {keys: all_keys[rank * per:(rank + 1) * per], targets: all_targets[rank * per:(rank + 1) * per]}

    return train, feed


def read_hash_checkpoint(path: str) -> dict:
    """{key: (value row, Adagrad slot row)} of the hash table in a checkpoint."""
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    keys = reader.get_tensor("item/keys")
    assert len(set(keys.tolist())) == len(keys), "a key is stored twice"
    values, slots = reader.get_tensor("item"), reader.get_tensor("item/Adagrad")
    return {int(k): (values[i], slots[i]) for i, k in enumerate(keys)}


def assert_hash_checkpoints_equal(path: str, expected_path: str) -> None:
    got, expected = read_hash_checkpoint(path), read_hash_checkpoint(expected_path)
    assert sorted(got) == sorted(expected), (path, sorted(got), sorted(expected))
    for key in expected:
        for a, b in zip(got[key], expected[key]):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6, err_msg=f"{path}: key {key}")
