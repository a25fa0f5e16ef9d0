"""One small Estimator model and its data, shared by the workers and the single-process references.

Features ``item`` (ids into an 11-row table, sharded under CollectiveStrategy)
and ``x`` (3 floats); a logistic output. Shares:

- even training: every step's global batch of ``GLOBAL_BATCH`` rows is split
  into contiguous per-worker parts of ``GLOBAL_BATCH / N`` rows;
- uneven training: worker ``r`` has ``3 - r`` batches of 2 rows;
- evaluation and prediction: worker ``r`` has ``4 + 3 r`` rows in batches of 3
  (a partial last batch on every worker).
"""

import contextlib
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

VOCAB, DIM, FEATURES = 11, 2, 3
GLOBAL_BATCH, EVEN_STEPS = 6, 4
UNEVEN_BATCH, EVAL_BATCH = 2, 3
LEARNING_RATE = 0.5
TABLE = np.random.default_rng(1).normal(0, 0.5, (VOCAB, DIM)).astype(np.float32)
W = np.linspace(-0.4, 0.5, DIM + FEATURES).reshape(-1, 1).astype(np.float32)

Batch = Dict[str, np.ndarray]


def rows(seed: int, n: int) -> Batch:
    rng = np.random.default_rng(seed)
    return {"item": rng.integers(0, VOCAB, n).astype(np.int64),
            "x": rng.normal(0, 1, (n, FEATURES)).astype(np.float32),
            "label": rng.integers(0, 2, (n, 1)).astype(np.float32)}


def take(batch: Batch, lo: int, hi: int) -> Batch:
    return {k: v[lo:hi] for k, v in batch.items()}


def concat(batches: Sequence[Batch]) -> Batch:
    if not batches:
        return {"item": np.zeros([0], np.int64), "x": np.zeros([0, FEATURES], np.float32),
                "label": np.zeros([0, 1], np.float32)}
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def even_batches(rank: int, n: int, steps: int = EVEN_STEPS) -> List[Batch]:
    data, per = rows(10, GLOBAL_BATCH * EVEN_STEPS), GLOBAL_BATCH // n
    return [take(data, s * GLOBAL_BATCH + rank * per, s * GLOBAL_BATCH + (rank + 1) * per) for s in range(steps)]


def uneven_batches(rank: int, n: int) -> List[Batch]:  # pylint: disable=unused-argument
    data = rows(20 + rank, UNEVEN_BATCH * 3)
    return [take(data, k * UNEVEN_BATCH, (k + 1) * UNEVEN_BATCH) for k in range(3 - rank)]


def eval_batches(rank: int, n: int) -> List[Batch]:  # pylint: disable=unused-argument
    count = 4 + 3 * rank
    data = rows(30 + rank, count)
    return [take(data, lo, min(lo + EVAL_BATCH, count)) for lo in range(0, count, EVAL_BATCH)]


def dataset(batches: Sequence[Batch]) -> tf.data.Dataset:
    """The batches as a tf.data pipeline of (features, labels), re-batched from rows."""
    data, size = concat(batches), max(len(b["item"]) for b in batches)
    ds = tf.data.Dataset.from_tensor_slices(({"item": data["item"], "x": data["x"]}, data["label"]))
    return ds.batch(size)


def logits_of(features, strategy=None):
    scope = strategy.embedding_scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        table = tf.compat.v1.get_variable("table", [VOCAB, DIM], initializer=tf.compat.v1.constant_initializer(TABLE))
    w = tf.compat.v1.get_variable("w", [DIM + FEATURES, 1], initializer=tf.compat.v1.constant_initializer(W))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.constant_initializer(0.1))
    emb = tf.nn.embedding_lookup(table, features["item"])
    return tf.matmul(tf.concat([emb, features["x"]], 1), w) + b


def metric_ops(labels, logits):
    prob = tf.sigmoid(logits)
    return {"auc": tf.compat.v1.metrics.auc(labels, prob),
            "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.cast(logits > 0, tf.float32)),
            "mse": tf.compat.v1.metrics.mean_squared_error(labels, prob)}


def keras_metrics(labels, logits):
    """Keras metrics, as the canned estimators use them: ``{name: (metric, its update op)}``.

    Estimator adds their variables to ``METRIC_VARIABLES`` from a set, in an
    order of each process's own: several of them tell a sum by position from
    one by name.
    """
    metrics = {"label_mean": tf.keras.metrics.Mean(name="label_mean"),
               "logit_mean": tf.keras.metrics.Mean(name="logit_mean"),
               "keras_auc": tf.keras.metrics.AUC(num_thresholds=20, name="keras_auc"),
               "keras_accuracy": tf.keras.metrics.BinaryAccuracy(name="keras_accuracy")}
    prob = tf.sigmoid(logits)
    inputs = {"label_mean": (labels,), "logit_mean": (logits,), "keras_auc": (labels, prob),
              "keras_accuracy": (labels, prob)}
    return {name: (metric, metric.update_state(*inputs[name])) for name, metric in metrics.items()}


def sgd():
    return tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE)


def adagrad():
    """Adagrad: updates only the gradient's rows and has a slot per variable (incremental checkpoint cases)."""
    return tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE)


SLOTS = {sgd: (), adagrad: ("table/Adagrad", "w/Adagrad", "b/Adagrad")}


def make_model_fn(strategy, optimizer=sgd, chief_hooks=lambda: []):
    """The model trained by ``optimizer()``; ``chief_hooks()`` gives the EstimatorSpec's training_chief_hooks."""
    def model_fn(features, labels, mode, params):  # pylint: disable=unused-argument
        logits = logits_of(features, strategy)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits, "item": features["item"]})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        if mode == tf.estimator.ModeKeys.EVAL:
            ops = metric_ops(labels, logits)
            ops.update({name: metric for name, (metric, _) in keras_metrics(labels, logits).items()})
            return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=ops)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = optimizer().minimize(loss, global_step=step)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_chief_hooks=chief_hooks())

    return model_fn


def batch_norm_layers(width: int = FEATURES):
    """``(apply, keras_layer)``; ``apply(x)`` gives ``x`` ``[rows, width]`` through a fused v1 batch norm (as NHWC)
    and through Keras' (not fused)."""
    keras_bn = tf.keras.layers.BatchNormalization(name="bn_keras")

    def apply(x):
        nhwc = tf.reshape(x, [-1, 1, 1, width])
        fused = tf.compat.v1.layers.batch_normalization(nhwc, training=True, fused=True, name="bn_fused")
        return tf.reshape(fused, [-1, width]), keras_bn(x, training=True)

    return apply, keras_bn


def make_batch_norm_model_fn(strategy):
    """The model on ``x`` batch-normalised twice (``fused + keras``); trains the moving statistics too."""
    def model_fn(features, labels, mode):
        apply, keras_bn = batch_norm_layers()
        fused, plain = apply(features["x"])
        logits = logits_of({"item": features["item"], "x": fused + plain}, strategy)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) + list(keras_bn.updates)
        with tf.control_dependencies(updates):
            train_op = tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE).minimize(
                loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


# ------------------------------------------------------------ single-process references

# Each reference program is built once per process and shape (graph and session), then run again from its
# initial values for every call: the tests ask the same programs for several runs' data.
_PROGRAMS: Dict[tuple, tuple] = {}


def _program(key: tuple, build):
    """``(session, handles)`` of the program ``build()`` (called in a new graph) under ``key``, built on first use."""
    if key not in _PROGRAMS:
        graph = tf.Graph()
        with graph.as_default():
            handles = build()
        _PROGRAMS[key] = (tf.compat.v1.Session(graph=graph), handles)
    return _PROGRAMS[key]


def _moving_statistics_program(width: int):
    x = tf.compat.v1.placeholder(tf.float32, [None, width])
    apply, keras_bn = batch_norm_layers(width)
    apply(x)
    updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) + list(keras_bn.updates)
    moving = {v.op.name: v for v in tf.compat.v1.global_variables() if "moving_" in v.op.name}
    return x, updates, moving, tf.compat.v1.global_variables_initializer()


def reference_moving_statistics(xs: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
    """Plain TensorFlow: :func:`batch_norm_layers`' moving statistics after training mode on the batches ``xs``."""
    width = xs[0].shape[1]
    sess, (x, updates, moving, init) = _program(("moving", width), lambda: _moving_statistics_program(width))
    sess.run(init)
    for batch in xs:
        sess.run(updates, {x: batch})
    return sess.run(moving)


def reference_train(steps: Sequence[Sequence[Batch]], n: int):
    """Plain TensorFlow: each step's loss is sum over workers of their batch mean, over n (empty batches add 0).

    Returns (table, w, b) after all steps; with equal batches this is training on the global batch.
    """
    state = reference_state(steps, n)
    return state["table"], state["w"], state["b"]


def _state_program(n: int, optimizer):
    holders = [{"item": tf.compat.v1.placeholder(tf.int64, [None]),
                "x": tf.compat.v1.placeholder(tf.float32, [None, FEATURES]),
                "label": tf.compat.v1.placeholder(tf.float32, [None, 1])} for _ in range(n)]
    losses = []
    with tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
        for h in holders:
            ce = tf.nn.sigmoid_cross_entropy_with_logits(labels=h["label"], logits=logits_of(h))
            losses.append(tf.reduce_sum(ce) / tf.maximum(tf.cast(tf.size(ce), tf.float32), 1.0))
    train_op = optimizer().minimize(tf.add_n(losses) / n)
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    state = {name: variables[name] for name in ("table", "w", "b") + SLOTS[optimizer]}
    return holders, train_op, state, tf.compat.v1.global_variables_initializer()


def reference_state(steps: Sequence[Sequence[Batch]], n: int, optimizer=sgd) -> Dict[str, np.ndarray]:
    """:func:`reference_train` with ``optimizer()``: ``{name: value}`` of table, w, b and their slots (SLOTS)."""
    sess, (holders, train_op, state, init) = _program(("state", n, optimizer), lambda: _state_program(n, optimizer))
    sess.run(init)
    for per_worker in steps:
        feed = {}
        for h, batch in zip(holders, list(per_worker) + [concat([])] * (n - len(per_worker))):
            feed.update({h[k]: batch[k] for k in h})
        sess.run(train_op, feed)
    return sess.run(state)


def _eval_program():
    item = tf.compat.v1.placeholder(tf.int64, [None])
    x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
    label = tf.compat.v1.placeholder(tf.float32, [None, 1])
    table = tf.compat.v1.placeholder(tf.float32, [VOCAB, DIM])
    w = tf.compat.v1.placeholder(tf.float32, [DIM + FEATURES, 1])
    b = tf.compat.v1.placeholder(tf.float32, [1])
    logits = tf.matmul(tf.concat([tf.gather(table, item), x], 1), w) + b
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
    ops = metric_ops(label, logits)
    ops["loss"] = tf.compat.v1.metrics.mean(loss)
    keras = keras_metrics(label, logits)
    ops.update({name: (metric.result(), update) for name, (metric, update) in keras.items()})
    reset = [tf.compat.v1.local_variables_initializer(),
             tf.compat.v1.variables_initializer([v for metric, _ in keras.values() for v in metric.variables])]
    return (item, x, label), (table, w, b), tf.group([op[1] for op in ops.values()]), \
        {k: op[0] for k, op in ops.items()}, reset


def reference_eval(batches: Sequence[Batch], table, w, b) -> Dict[str, float]:
    """Plain single-process evaluation of all batches with Estimator's metrics (loss: mean of batch losses)."""
    sess, ((item, x, label), weights, update, values, reset) = _program(("eval",), _eval_program)
    sess.run(reset)
    given = dict(zip(weights, (table, w, b)))
    for batch in batches:
        sess.run(update, {item: batch["item"], x: batch["x"], label: batch["label"], **given})
    return {k: float(v) for k, v in sess.run(values).items()}


def reference_logits(batch: Batch, table, w, b) -> np.ndarray:
    feats = np.concatenate([table[batch["item"]], batch["x"]], 1).astype(np.float64)
    return feats @ w + b
