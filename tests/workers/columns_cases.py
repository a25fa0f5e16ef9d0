"""Feature-column models built alike with and without collective.

Five ways TensorFlow looks up embedding columns, each on several columns:
v1 ``input_layer``, v1 ``shared_embedding_columns``, v2 ``shared_embeddings``
in Keras ``DenseFeatures``, v2 ``DenseFeatures`` and v1-compat
``DenseFeatures``. With a strategy the columns are built inside
``embedding_scope()``; a small head trains on all of them.
"""

import contextlib

import numpy as np
import tensorflow as tf

try:
    import grouped_cases as data
except ImportError:  # imported by the tests as workers.columns_cases
    from workers import grouped_cases as data

VOCAB_A, VOCAB_C = 23, 11
CASES = ("input_layer", "shared_v1", "shared_v2", "dense_features_v2", "dense_features_v1")


def init(seed: int, vocab: int, dim: int):
    values = np.random.default_rng(50 + seed).normal(0, 0.5, (vocab, dim)).astype(np.float32)
    return tf.compat.v1.constant_initializer(values)


def global_batch(step: int):
    """Sparse features a, b (vocab 23), c (vocab 11), weights a_w, numeric num; labels [B, 1]."""
    rng = np.random.default_rng(300 + step)
    features = {"a": data.sparse_feature(rng, VOCAB_A, min_len=0), "b": data.sparse_feature(rng, VOCAB_A),
                "c": data.sparse_feature(rng, VOCAB_C, min_len=0)}
    num = rng.normal(size=(data.BATCH, 1)).astype(np.float32)
    labels = rng.integers(0, 2, (data.BATCH, 1)).astype(np.float32)
    return features, num, labels


def local_batch(step: int, rank: int, size: int):
    features, num, labels = global_batch(step)
    lo, hi = data.local_rows(rank, size)
    return {k: data.local_feature(f, rank, size) for k, f in features.items()}, num[lo:hi], labels[lo:hi]


def placeholders():
    features = {k: tf.compat.v1.sparse_placeholder(tf.int64, [None, data.WIDTH]) for k in ("a", "b", "c")}
    features["a_w"] = tf.compat.v1.sparse_placeholder(tf.float32, [None, data.WIDTH])
    features["num"] = tf.compat.v1.placeholder(tf.float32, [None, 1])
    return features


def feed_dict(features, batch):
    sparse, num, _ = batch
    n = len(num)
    feed = {features[k]: data.sparse_value(rows, ids, n) for k, (rows, ids, _) in sparse.items()}
    rows, _, weights = sparse["a"]
    feed[features["a_w"]] = data.sparse_value(rows, weights, n)
    feed[features["num"]] = num
    return feed


def identity(key: str):
    return tf.feature_column.categorical_column_with_identity(key, VOCAB_C if key == "c" else VOCAB_A)


def build_case(case: str, features) -> tf.Tensor:
    """The input layer of ``case`` over ``features``: ``[batch, width]``."""
    num = tf.feature_column.numeric_column("num")
    fc1 = tf.compat.v1.feature_column
    if case == "input_layer":
        weighted = tf.feature_column.weighted_categorical_column(identity("a"), "a_w")
        columns = [fc1.embedding_column(identity("a"), 4, combiner="mean", initializer=init(1, VOCAB_A, 4)),
                   fc1.embedding_column(identity("c"), 3, combiner="sqrtn", initializer=init(2, VOCAB_C, 3)),
                   fc1.embedding_column(weighted, 4, combiner="sum", initializer=init(3, VOCAB_A, 4)), num]
        return fc1.input_layer(features, columns)
    if case == "shared_v1":
        columns = fc1.shared_embedding_columns([identity("a"), identity("b")], 4, combiner="sum",
                                               initializer=init(4, VOCAB_A, 4),
                                               shared_embedding_collection_name="shared_v1")
        return fc1.input_layer(features, columns)
    if case == "shared_v2":
        columns = tf.feature_column.shared_embeddings([identity("a"), identity("b")], 4, combiner="mean",
                                                      initializer=init(5, VOCAB_A, 4),
                                                      shared_embedding_collection_name="shared_v2")
        return tf.keras.layers.DenseFeatures(columns, name="shared_v2_features")(features)
    if case == "dense_features_v2":
        columns = [tf.feature_column.embedding_column(identity("c"), 3, combiner="mean", initializer=init(6, VOCAB_C, 3)),
                   tf.feature_column.embedding_column(identity("b"), 4, combiner="sqrtn",
                                                      initializer=init(7, VOCAB_A, 4)),
                   tf.feature_column.embedding_column(identity("a"), 4, combiner="sum",
                                                      initializer=init(10, VOCAB_A, 4)), num]
        return tf.keras.layers.DenseFeatures(columns, name="v2_features")(features)
    if case == "dense_features_v1":
        columns = [fc1.embedding_column(identity("b"), 4, initializer=init(8, VOCAB_A, 4)),
                   fc1.embedding_column(identity("a"), 4, combiner="sum", initializer=init(9, VOCAB_A, 4))]
        return tf.compat.v1.keras.layers.DenseFeatures(columns, name="v1_features")(features)
    raise ValueError(case)


def collective_ops(graph) -> dict:
    counts = {}
    for op in graph.get_operations():
        if op.type.startswith("Horovod"):
            counts[op.type] = counts.get(op.type, 0) + 1
    return counts


def run(batches, strategy=None):
    """Builds every case, looks up ``batches[0]``, trains on all; returns a dict of arrays."""
    results = {}
    with tf.Graph().as_default() as graph:
        features = placeholders()
        outputs = {}
        for case in CASES:
            before = collective_ops(graph)
            with strategy.embedding_scope() if strategy is not None else contextlib.nullcontext():
                outputs[case] = build_case(case, features)
            after = collective_ops(graph)
            for op_type, count in after.items():
                results[f"ops_{case}_{op_type}"] = count - before.get(op_type, 0)
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        emb = tf.concat([outputs[case] for case in CASES], axis=1)
        width = int(emb.shape[1])
        w = tf.compat.v1.get_variable("head", [width, 1], initializer=tf.compat.v1.constant_initializer(
            np.linspace(-0.3, 0.3, width).reshape(-1, 1)))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.matmul(tf.tanh(emb),
                                                                                                      w)))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
        trainable = tf.compat.v1.trainable_variables()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for case, value in sess.run(outputs, feed_dict(features, batches[0])).items():
                results[f"out_{case}"] = value
            losses = []
            for batch in batches:
                feed = feed_dict(features, batch)
                feed[labels] = batch[2]
                losses.append(sess.run([loss, train_op], feed)[0])
            results["losses"] = np.array(losses)
            for var, value in zip(trainable, sess.run(trainable)):
                results[f"var:{var.op.name}"] = value
    return results
