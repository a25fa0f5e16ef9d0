"""Initial values of sharded tables: the same logical table for any world size, no repeated blocks.

Regression: shards were filled 8,192 rows at a time by calling the
initializer once per block, and stateless initializers (Keras', seeded TF2
ones) return the same block every call, so rows i and i + 8192 started
equal and a seeded table differed between 1 and N workers.
"""

import numpy as np
import pytest
import tensorflow as tf

from collective.embedding import table as table_lib
from collective.embedding.table import ShardInfo, shard_initial_value

VOCAB, DIM = 20000, 2

INITIALIZERS = {
    "keras_uniform_seeded": lambda: tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=3),
    "keras_uniform_unseeded": lambda: tf.keras.initializers.RandomUniform(-0.05, 0.05),
    "tf2_normal_seeded": lambda: tf.random_normal_initializer(0.0, 0.1, seed=7),
    "tf1_truncated_seeded": lambda: tf.compat.v1.truncated_normal_initializer(0.0, 0.1, seed=11),
    "keras_glorot_seeded": lambda: tf.keras.initializers.GlorotUniform(seed=5),
}


def logical_table(initializer, world_size: int, replicated: bool = False) -> np.ndarray:
    """The logical table rebuilt from every rank's initial shard, all in one graph."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        infos = [ShardInfo("t", VOCAB, DIM, r, world_size, replicated=replicated) for r in range(world_size)]
        shards = sess.run([shard_initial_value(initializer, info, tf.float32) for info in infos])
    if replicated:
        for shard in shards[1:]:
            np.testing.assert_array_equal(shard, shards[0])
        return shards[0]
    full = np.zeros((VOCAB, DIM), np.float32)
    for r, shard in enumerate(shards):
        assert shard.shape == (infos[r].local_rows, DIM)
        full[r::world_size] = shard
    return full


def one_process(initializer) -> np.ndarray:
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        return sess.run(tf.convert_to_tensor(initializer([VOCAB, DIM], dtype=tf.float32)))


@pytest.mark.parametrize("name", sorted(INITIALIZERS))
def test_small_tables_equal_one_tensorflow_process_for_any_world_size(name):
    initializer = INITIALIZERS[name]()
    expected = one_process(initializer)
    for n in (1, 2, 3):
        np.testing.assert_array_equal(logical_table(initializer, n), expected, err_msg=f"{name}, {n} workers")
    np.testing.assert_array_equal(logical_table(initializer, 3, replicated=True), expected)
    assert not np.array_equal(expected[:8192], expected[8192:16384])


@pytest.mark.parametrize("name", sorted(INITIALIZERS))
def test_large_tables_are_one_logical_table_for_any_world_size(name, monkeypatch):
    """Above WHOLE_TABLE_INIT_BYTES each row is a function of (row, seed): no worker holds the whole table."""
    monkeypatch.setattr(table_lib, "WHOLE_TABLE_INIT_BYTES", 0)
    initializer = INITIALIZERS[name]()
    one = logical_table(initializer, 1)
    for n in (2, 3):
        np.testing.assert_array_equal(logical_table(initializer, n), one, err_msg=f"{name}, {n} workers")
    assert len(np.unique(one, axis=0)) == VOCAB  # no two rows alike, no repeated block
    reference = one_process(initializer)  # the same distribution as TensorFlow's own draw
    assert abs(one.std() - reference.std()) < 0.05 * reference.std() + 1e-6
    assert abs(one.mean() - reference.mean()) < 0.05 * reference.std() + 1e-6
