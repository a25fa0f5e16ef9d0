"""Canned estimators (DNN, linear, wide & deep classifiers) and sharded-table warm starts, shared by the
workers (tests/workers/canned_worker.py) and the one-process references (tests/test_estimator.py).

Every model starts from one initial checkpoint written by plain TensorFlow
(:func:`write_initial_checkpoint`), loaded by ``init_from_checkpoint`` in a
wrapping model_fn (:func:`starting_from`), so the workers and the reference
start from the same values whatever their graphs' random seeds do.
"""

import numpy as np
import tensorflow as tf

VOCAB, EMB_DIM, GLOBAL_BATCH, STEPS, EVAL_BATCH = 5, 2, 6, 2, 2
NAMES = ("dnn", "linear", "combined")
WARM = {"ws/t1": 1, "ws/t2": 2, "ws3/t3": 3, "ws4/t4": 4}  # warm-started tables: name -> value seed
PREDICT_FEED = {"item": np.array([[0], [1], [2], [3], [4], [2]], np.int64),
                "x": np.array([[0.5], [-1.0], [0.0], [2.0], [1.0], [-0.5]], np.float32)}


def data():
    rng = np.random.default_rng(7)
    n = GLOBAL_BATCH * STEPS
    return ({"item": rng.integers(0, VOCAB, (n, 1)).astype(np.int64), "x": rng.normal(0, 1, (n, 1)).astype(np.float32)},
            rng.integers(0, 2, (n, 1)).astype(np.int64))


def train_input_fn(rank: int, n: int):
    """Worker ``rank``'s contiguous share of each step's global batch (the whole batch for ``n == 1``)."""
    features, labels = data()
    per = GLOBAL_BATCH // n
    keep = np.concatenate([np.arange(s * GLOBAL_BATCH + rank * per, s * GLOBAL_BATCH + (rank + 1) * per)
                           for s in range(STEPS)])
    return lambda: tf.data.Dataset.from_tensor_slices(({k: v[keep] for k, v in features.items()},
                                                       labels[keep])).batch(per)


def eval_input_fn(rank: int, n: int):
    features, labels = data()
    return lambda: tf.data.Dataset.from_tensor_slices(({k: v[rank::n] for k, v in features.items()},
                                                       labels[rank::n])).batch(EVAL_BATCH)


def serving_input_receiver_fn():
    return tf.estimator.export.build_raw_serving_input_receiver_fn(
        {"item": tf.compat.v1.placeholder(tf.int64, [None, 1], name="item"),
         "x": tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")})()


def canned(name: str, model_dir: str):
    item = tf.feature_column.categorical_column_with_identity("item", VOCAB)
    x = tf.feature_column.numeric_column("x")
    emb = tf.feature_column.embedding_column(item, EMB_DIM)
    if name == "dnn":
        return tf.estimator.DNNClassifier(hidden_units=[3], feature_columns=[emb, x], model_dir=model_dir)
    if name == "linear":
        return tf.estimator.LinearClassifier(feature_columns=[item, x], model_dir=model_dir)
    return tf.estimator.DNNLinearCombinedClassifier(linear_feature_columns=[item, x], dnn_feature_columns=[emb, x],
                                                    dnn_hidden_units=[3], model_dir=model_dir)


def write_initial_checkpoint(name: str, model_dir: str) -> str:
    """Builds ``name``'s training graph in plain TensorFlow and saves its initial trainable variables."""
    estimator = canned(name, model_dir)
    features, labels = data()
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        estimator.model_fn({k: tf.constant(v) for k, v in features.items()}, tf.constant(labels),
                           tf.estimator.ModeKeys.TRAIN, estimator.config)
        saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.io.gfile.makedirs(f"{model_dir}/initial")
            return saver.save(sess, f"{model_dir}/initial/model.ckpt")


def starting_from(estimator, initial: str):
    """``estimator``'s model_fn, its trainable variables loaded from ``initial`` when training starts."""
    def model_fn(features, labels, mode, config):
        spec = estimator.model_fn(features, labels, mode, config)
        if mode == tf.estimator.ModeKeys.TRAIN:
            tf.compat.v1.train.init_from_checkpoint(initial, {v.op.name: v for v in tf.compat.v1.trainable_variables()})
        return spec

    return model_fn


def in_embedding_scope(strategy, estimator):
    """``estimator``'s model_fn built inside ``embedding_scope()`` (refused)."""
    def model_fn(features, labels, mode, config):
        with strategy.embedding_scope():
            return estimator.model_fn(features, labels, mode, config)

    return model_fn


def warm_table_model_fn(strategy):
    """A model_fn over the sharded table ``ws/t1`` that training leaves as it starts (learning rate 0)."""
    def model_fn(features, labels, mode):  # pylint: disable=unused-argument
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("ws/t1", [VOCAB, EMB_DIM])
        emb = tf.nn.embedding_lookup(table, tf.reshape(features["item"], [-1]))
        loss = tf.reduce_mean(tf.square(emb))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"emb": emb})

    return model_fn


def warm_values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (VOCAB, EMB_DIM)).astype(np.float32)


def write_warm_checkpoint(path: str) -> str:
    """A plain TensorFlow checkpoint of the whole tables of :data:`WARM`."""
    with tf.Graph().as_default():
        tables = [tf.compat.v1.get_variable(name, initializer=tf.constant(warm_values(seed)))
                  for name, seed in WARM.items()]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.io.gfile.makedirs(path.rpartition("/")[0])
            return tf.compat.v1.train.Saver(tables).save(sess, path)
