"""The incremental checkpoint tests' model and schedule, shared by the workers and the test.

A fixed sharded table ``t`` and a hash-table vocabulary ``item`` (keys
negative and huge included, new keys at every step), both with Adagrad
slots (Adagrad updates only the rows of a gradient, so deltas hold only the
rows trained), and a dense layer. A chain is a full checkpoint at global
step ``BASE_STEP`` and deltas at ``DELTA_STEPS`` (the second one spans two
steps).
"""

import os

import numpy as np
import tensorflow as tf

from collective.checkpoint import Saver

try:
    import checkpoint_cases as cc  # a worker: tests/workers is on sys.path
except ImportError:
    from workers import checkpoint_cases as cc

VOCAB, DIM, BATCH = 40, 4, 6
BASE_STEP, DELTA_STEPS = 2, (3, 5, 6)
LAST_STEP = DELTA_STEPS[-1]
KEYS = cc.HASH_KEYS
TABLES = ("t", "item")  # the names a sharding override gives them
TABLE_KEYS = ("t", "t/Adagrad")
DENSE_KEYS = ("w", "w/Adagrad", "b", "b/Adagrad", "global_step")


def global_batch(step: int):
    """(ids [B, 2] of t, keys [B, 2] of item, targets [B, 1]) of one global batch."""
    rng = np.random.default_rng(900 + step)
    ids = rng.integers(0, VOCAB, size=(BATCH, 2))
    keys = rng.choice(KEYS[: 4 + 2 * step], size=(BATCH, 2))
    return ids.astype(np.int64), keys.astype(np.int64), rng.normal(size=(BATCH, 1)).astype(np.float32)


def build(strategy):
    """The model; returns (train op, global step, feed(step, rank, size))."""
    from collective.embedding.hash_table import hash_embedding_variable  # pylint: disable=import-outside-toplevel

    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    keys = tf.compat.v1.placeholder(tf.int64, [None, 2])
    targets = tf.compat.v1.placeholder(tf.float32, [None, 1])
    with strategy.embedding_scope():
        t = tf.compat.v1.get_variable("t", [VOCAB, DIM],
                                      initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=3))
        item = hash_embedding_variable("item", dim=DIM, capacity_per_worker=32,
                                       initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5))
    features = tf.concat([tf.reshape(tf.nn.embedding_lookup(t, ids), [-1, 2 * DIM]),
                          tf.reshape(tf.nn.embedding_lookup(item, keys), [-1, 2 * DIM])], 1)
    w = tf.compat.v1.get_variable("w", [4 * DIM, 1], initializer=tf.compat.v1.random_normal_initializer(seed=4))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(features), w) + b - targets))
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdagradOptimizer(0.2).minimize(loss, global_step=step)

    def feed(step_index: int, rank: int, size: int):
        all_ids, all_keys, all_targets = global_batch(step_index)
        per = BATCH // size
        part = slice(rank * per, (rank + 1) * per)
        return {ids: all_ids[part], keys: all_keys[part], targets: all_targets[part]}

    return train, step, feed


def train_chain(strategy, model_dir: str, full_every_step: bool = False) -> None:
    """Trains to LAST_STEP, a full save at BASE_STEP and deltas at DELTA_STEPS (or a full save every step)."""
    r, n = strategy.rank(), strategy.world_size()
    with strategy.scope(), tf.Graph().as_default():
        train, step, feed = build(strategy)
        saver = Saver(max_to_keep=None)
        path = os.path.join(model_dir, "model.ckpt")
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for i in range(LAST_STEP):
                sess.run(train, feed(i, r, n))
                done = i + 1
                if done == BASE_STEP or (full_every_step and done > BASE_STEP):
                    saver.save(sess, path, global_step=done)
                elif done in DELTA_STEPS:
                    saver.save_incremental(sess, path, global_step=done)


def restore_chains(strategy, sources, out_dir: str) -> None:
    """Restores every chain end of each source model_dir in one session; saves each as a full checkpoint.

    ``<out_dir>/<source name>/model.ckpt-<step>`` holds what the chain to
    delta ``step`` restored under this world size.
    """
    with strategy.scope(), tf.Graph().as_default():
        build(strategy)
        saver = Saver(max_to_keep=None)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for source in sources:
                for step in DELTA_STEPS:
                    saver.restore(sess, os.path.join(source, f"model.ckpt-{step}.delta"))
                    saver.save(sess, os.path.join(out_dir, os.path.basename(source), "model.ckpt"), global_step=step)


def train_mts(strategy, model_dir: str, last_step: int) -> int:
    """MonitoredTrainingSession with a delta every step and no full-save hook, to ``last_step``.

    The first delta due finds no full checkpoint and writes one; a rerun
    resumes from the newest chain. Prints and returns the step the session started at.
    """
    r, n = strategy.rank(), strategy.world_size()
    started = []

    class Start(tf.compat.v1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            started.append(int(session.run(tf.compat.v1.train.get_global_step())))
            print(f"rank {r} mts started at step {started[0]}", flush=True)

    with strategy.scope(), tf.Graph().as_default():
        train, _, feed = build(strategy)
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=model_dir, save_checkpoint_secs=None, save_summaries_steps=None,
                save_incremental_checkpoint_steps=1, log_step_count_steps=None,
                hooks=[Start(), tf.compat.v1.train.StopAtStepHook(last_step=last_step)]) as sess:
            step = started[0]
            while not sess.should_stop():
                sess.run(train, feed(step, r, n))
                step += 1
    return started[0]


def changed(steps) -> tuple:
    """(distinct ids of t, distinct keys of item) the global batches of ``steps`` reach."""
    ids = np.unique(np.concatenate([global_batch(s)[0].ravel() for s in steps]))
    keys = np.unique(np.concatenate([global_batch(s)[1].ravel() for s in steps]))
    return len(ids), len(keys)


def read(path: str) -> dict:
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    return {key: reader.get_tensor(key) for key in TABLE_KEYS + DENSE_KEYS}


def assert_same_model(path: str, expected_path: str, what: str = "") -> None:
    """Two full checkpoints hold the same t, dense variables and slots, and item key by key."""
    got, expected = read(path), read(expected_path)
    for key in TABLE_KEYS + DENSE_KEYS:
        np.testing.assert_allclose(got[key], expected[key], rtol=2e-4, atol=1e-6, err_msg=f"{what} {path}: {key}")
    cc.assert_hash_checkpoints_equal(path, expected_path)
