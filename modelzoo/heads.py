"""The loss, metrics and train op every model shares, and the same metrics in numpy.

A model computes one output per example (a logit for ``binary``, a value for
``regression``) and hands it to :func:`estimator_spec`, which builds the
``EstimatorSpec`` for each mode. Predictions and export outputs are those of
``tf.estimator``'s own heads (``BinaryClassHead``, ``RegressionHead``), so a
SavedModel has the signatures, output keys, shapes and dtypes Estimator users
serve:

- binary: ``logits``, ``logistic`` (sigmoid) and ``class_ids`` ``[B, 1]``,
  ``probabilities`` ``[B, 2]`` (``[1 - p, p]``), ``classes`` ``[B, 1]``
  string, ``all_class_ids`` / ``all_classes`` ``[B, 2]``; signatures
  ``serving_default`` and ``classification`` (scores and classes),
  ``regression`` (``logistic``) and ``predict`` (all of them);
- regression: ``predictions`` ``[B, 1]``; signatures ``serving_default`` and
  ``regression``, and ``predict``.

The classification and regression signatures take one serialized
``tf.Example`` string tensor (TensorFlow's rule); with raw feature tensors only
``predict`` can be written (see :func:`collective.integration.export.export_estimator`).
:func:`numpy_metrics` computes the same metrics exactly from gathered
predictions (the session engine's evaluation).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

TASKS = ("binary", "regression")
OPTIMIZERS = ("adagrad", "adam", "sgd", "ftrl")
PREDICT, EVAL, TRAIN = tf.estimator.ModeKeys.PREDICT, tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.TRAIN


def make_optimizer(name: str, learning_rate: float) -> tf.compat.v1.train.Optimizer:
    """A TF1 optimizer by name: ``adagrad``, ``adam``, ``sgd`` or ``ftrl``."""
    opt = tf.compat.v1.train
    makers = {"adagrad": lambda: opt.AdagradOptimizer(learning_rate, initial_accumulator_value=1e-3),
              "adam": lambda: opt.AdamOptimizer(learning_rate),
              "sgd": lambda: opt.GradientDescentOptimizer(learning_rate),
              "ftrl": lambda: opt.FtrlOptimizer(learning_rate)}
    if name not in makers:
        raise ValueError(f"optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
    return makers[name]()


def _head(task: str):
    """``tf.estimator``'s head of ``task``: the source of the prediction keys and export outputs."""
    return tf.estimator.BinaryClassHead() if task == "binary" else tf.estimator.RegressionHead()


def _head_logits(task: str, output: tf.Tensor, value_range) -> tf.Tensor:
    """``[B, 1]``: the logit, or the regression value clipped to ``value_range`` (what is served)."""
    if task == "regression" and value_range is not None:
        output = tf.clip_by_value(output, value_range[0], value_range[1])
    return tf.expand_dims(output, -1)


def score_key(task: str) -> str:
    """The ``[B, 1]`` prediction metrics score: ``logistic`` (binary) or ``predictions`` (regression)."""
    return "logistic" if task == "binary" else "predictions"


def estimator_spec(mode: str, output: tf.Tensor, labels: Optional[Mapping[str, tf.Tensor]], params: Mapping,
                   extra_loss: Optional[tf.Tensor] = None) -> tf.estimator.EstimatorSpec:
    """The ``EstimatorSpec`` of a model with one output per example.

    ``params`` keys used: ``task`` (``binary`` or ``regression``), ``target``
    (the label column trained on), ``optimizer``, ``learning_rate``, and for
    regression ``value_range`` (predictions are clipped to it) and
    ``auc_label`` (a binary column whose AUC the prediction is scored by).
    ``extra_loss`` (e.g. regularisation) is added to the training loss only.
    """
    task = params["task"]
    if task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")
    output = tf.reshape(output, [-1])
    head, head_logits = _head(task), _head_logits(task, output, params.get("value_range"))
    if mode == PREDICT:
        return head.create_estimator_spec(features={}, mode=mode, logits=head_logits)
    predictions = head.predictions(head_logits)
    score = tf.reshape(predictions[score_key(task)], [-1])
    target = tf.reshape(tf.cast(labels[params["target"]], tf.float32), [-1])
    if task == "binary":
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=target, logits=output))
        auc_label = target
    else:
        # Training fits the raw output; evaluation scores what is served (clipped to value_range).
        loss = tf.reduce_mean(tf.square((output if mode == TRAIN else score) - target))
        auc_label = labels.get(params.get("auc_label")) if params.get("auc_label") else None
    metrics = {}
    if auc_label is not None:
        metrics["auc"] = tf.compat.v1.metrics.auc(tf.reshape(tf.cast(auc_label, tf.float32), [-1]), score,
                                                  num_thresholds=2000, summation_method="careful_interpolation")
    if task == "regression":
        metrics["rmse"] = tf.compat.v1.metrics.root_mean_squared_error(target, score)
    if mode == EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, predictions=predictions, eval_metric_ops=metrics)
    total = loss if extra_loss is None else loss + extra_loss
    optimizer = make_optimizer(params["optimizer"], params["learning_rate"])
    train_op = optimizer.minimize(total, global_step=tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, predictions=predictions, train_op=train_op)


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC from ranks (ties share their mean rank); NaN when one class is absent."""
    labels = np.asarray(labels) > 0.5
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = np.unique(np.asarray(scores, np.float64), return_inverse=True, return_counts=True)
    mean_rank = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    return float((mean_rank[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def numpy_metrics(params: Mapping, predictions: Mapping[str, np.ndarray],
                  labels: Mapping[str, np.ndarray]) -> Dict[str, float]:
    """``loss`` and ``auc`` (binary) or ``loss``, ``rmse`` and ``auc`` (regression), as in :func:`estimator_spec`,
    from the head's ``[B]`` or ``[B, 1]`` predictions (``logits`` and ``logistic``, or ``predictions``)."""
    target = np.asarray(labels[params["target"]], np.float64).reshape(-1)
    if params["task"] == "binary":
        logits = np.asarray(predictions["logits"], np.float64).reshape(-1)
        loss = np.mean(np.maximum(logits, 0) - logits * target + np.log1p(np.exp(-np.abs(logits))))
        return {"loss": float(loss), "auc": exact_auc(target, np.asarray(predictions["logistic"]).reshape(-1))}
    value = np.asarray(predictions["predictions"], np.float64).reshape(-1)
    out = {"loss": float(np.mean(np.square(value - target))), "rmse": float(np.sqrt(np.mean(np.square(value - target))))}
    if params.get("auc_label"):
        out["auc"] = exact_auc(labels[params["auc_label"]], value)
    return out
