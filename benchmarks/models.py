"""Models the harness times, each buildable in every mode of :mod:`benchmarks.worker`.

A builder takes the feature tensors, labels, the run's parameters and a
context manager factory ``embedding_scope`` (the strategy's embedding scope
for ``hb``/``sok``, a no-op for the baselines) and returns the loss and the
click probabilities. The same builder serves every mode, so the backends
and the baselines train the same model.

- ``embedding``: the embedding-only step on Criteo-shaped data. Each of the
  26 categorical features has an ``embedding_column`` (one id per sample),
  the vectors and the 13 dense features feed one linear layer. Almost all
  parameters and all the traffic are in the tables.
- ``dlrm``, ``deepfm``: the model zoo's ``model_fn`` (:mod:`modelzoo.dlrm`,
  :mod:`modelzoo.deepfm`) in evaluation mode for the loss and
  probabilities; the harness adds the optimizer, so every mode trains them
  the same way. Their tables are sharded when ``params['mode']`` is hb or
  sok and plain TensorFlow tables otherwise (the zoo's ``plain`` switch).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, Mapping, Tuple

import tensorflow as tf

from datasets import schema
from datasets.synthetic import cardinalities

Builder = Callable[[Mapping[str, tf.Tensor], tf.Tensor, Mapping[str, Any], Callable[[], ContextManager]],
                   Tuple[tf.Tensor, tf.Tensor]]


def table_sizes(params: Mapping[str, Any]) -> Tuple[int, ...]:
    """Rows of the 26 tables for the synthetic data's ``scale``."""
    return cardinalities(float(params["scale"]))


def embedding_columns(params: Mapping[str, Any]):
    """One ``embedding_column`` per categorical feature, ``params['dim']`` wide."""
    fc = tf.compat.v1.feature_column
    return [fc.embedding_column(fc.categorical_column_with_identity(name, vocab), int(params["dim"]),
                                combiner="sum",
                                initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05))
            for name, vocab in zip(schema.CATEGORICAL, table_sizes(params))]


def embedding_only(features: Mapping[str, tf.Tensor], labels: tf.Tensor, params: Mapping[str, Any],
                   embedding_scope: Callable[[], ContextManager]) -> Tuple[tf.Tensor, tf.Tensor]:
    """The embedding-only step: 26 embedding columns and the dense features into one linear layer."""
    with embedding_scope():
        vectors = tf.compat.v1.feature_column.input_layer(
            {name: features[name] for name in schema.CATEGORICAL}, embedding_columns(params))
    inputs = tf.concat([vectors, features["dense"]], axis=1)
    logits = tf.compat.v1.layers.dense(inputs, 1, name="head")[:, 0]
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return loss, tf.sigmoid(logits)


def _zoo_features(features: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """The harness's placeholders in the model zoo's layout: one ``[batch]`` tensor per column."""
    out = {name: features["dense"][:, j] for j, name in enumerate(schema.DENSE)}
    out.update({name: features[name][:, 0] for name in schema.CATEGORICAL})
    return out


def zoo_params(params: Mapping[str, Any]) -> Dict[str, Any]:
    """The model zoo's ``params`` for a harness run (Criteo spec of the run's scale, its dim and seed)."""
    from modelzoo.features import criteo_spec  # pylint: disable=import-outside-toplevel

    dim = int(params["dim"])
    return {"spec": criteo_spec(table_sizes(params)), "embedding_dim": dim, "task": "binary", "target": "label",
            "optimizer": "adagrad", "learning_rate": float(params["learning_rate"]), "seed": int(params["seed"]),
            "plain": params["mode"] not in ("hb", "sok"),
            "bottom_mlp": [64, 32, dim], "top_mlp": [64, 32, 1], "dnn": [64, 32]}


def _zoo(module: str) -> Builder:
    def build(features, labels, params, embedding_scope):
        import importlib  # pylint: disable=import-outside-toplevel

        model_fn = importlib.import_module(module).model_fn
        spec = model_fn(_zoo_features(features), {"label": labels}, tf.estimator.ModeKeys.EVAL, zoo_params(params))
        return spec.loss, tf.reshape(spec.predictions["logistic"], [-1])  # the head's [B, 1] click probability

    build.__doc__ = f"{module}.model_fn's loss and probabilities (EVAL mode: the harness adds the optimizer)."
    return build


MODELS: Dict[str, Builder] = {"embedding": embedding_only, "dlrm": _zoo("modelzoo.dlrm.model"),
                              "deepfm": _zoo("modelzoo.deepfm.model")}


def get(name: str) -> Builder:
    """The builder called ``name``; the error lists the known ones."""
    if name not in MODELS:
        raise KeyError(f"unknown benchmark model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def no_scope() -> ContextManager:
    """The ``embedding_scope`` of the baselines: tables stay ordinary variables."""
    return contextlib.nullcontext()
