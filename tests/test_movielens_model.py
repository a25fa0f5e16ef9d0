"""The MovieLens model's SVD++ implicit-feedback term and learning-rate schedule against numpy references
(plain TensorFlow in this process; test_modelzoo.py trains the model on 1 and 2 workers with every backend)."""

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from modelzoo.movielens.model import implicit_feedback, learning_rate, user_items


def test_implicit_feedback_is_the_sqrtn_sum_over_each_users_training_movies(tmp_path):
    rng = np.random.default_rng(0)
    users, items, dim = 5, 7, 3  # user 4 rated nothing: a zero vector
    user, item = rng.integers(0, 4, 40), rng.integers(0, items, 40)
    keep = np.unique(user * items + item, return_index=True)[1]  # one rating per (user, movie), as MovieLens
    user, item = user[keep], item[keep]
    paths = []
    for k, part in enumerate(np.array_split(rng.permutation(len(user)), 2)):  # two files, shuffled rows
        paths.append(str(tmp_path / f"train-{k}.parquet"))
        pq.write_table(pa.table({"user_id": user[part], "item_id": item[part], "rating": np.ones(len(part))}),
                       paths[-1])
    rated = user_items(paths, users)
    y = rng.normal(size=(items, dim)).astype(np.float32)
    batch = np.array([3, 0, 4, 3, 1], np.int64)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        table = tf.compat.v1.get_variable("y", initializer=y)
        sess.run(tf.compat.v1.global_variables_initializer())
        got = sess.run(implicit_feedback(tf.constant(batch), rated, table))
    for row, u in zip(got, batch):
        movies = item[user == u]
        want = y[movies].sum(axis=0) / math.sqrt(len(movies)) if len(movies) else np.zeros(dim)
        np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-6, err_msg=f"user {u}")


def test_learning_rate_decays_along_a_half_cosine_to_final_lr():
    params = {"learning_rate": 0.002, "final_lr": 0.1, "steps": 10}
    assert learning_rate({**params, "final_lr": 1.0}) == 0.002
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        step = tf.compat.v1.train.get_or_create_global_step()
        lr = learning_rate(params)
        sess.run(tf.compat.v1.global_variables_initializer())
        for s in (0, 5, 10, 20):
            sess.run(step.assign(s))
            cosine = 0.5 * (1 + math.cos(math.pi * min(s, 10) / 10))
            assert sess.run(lr) == pytest.approx(0.002 * (0.1 + 0.9 * cosine), rel=1e-6), s
