"""Models the harness times, built the same way in every mode of :mod:`benchmarks.worker`.

A builder takes the features as the input pipeline delivers them (one
``[batch]`` tensor per Criteo column, :mod:`datasets.schema`), the labels and
the run's parameters, and returns the loss and the click probabilities. The
same builder serves every mode; only ``sharded`` differs: tables made under
``embedding_scope()`` (hb, sok, replicated) or plain TensorFlow variables
(the stock Estimator, plain TF and Horovod data parallelism).

Tables are built through ``params['api']``: ``feature_columns`` (default:
``embedding_column(categorical_column_with_identity)`` through
``input_layer``, what a stock TensorFlow model has) or ``variables``
(``get_variable`` tables and the model zoo's grouped lookup).

- ``dlrm``, ``deepfm``: the model zoo's ``model_fn`` (:mod:`modelzoo.dlrm`,
  :mod:`modelzoo.deepfm`) in evaluation mode for the loss and
  probabilities, with the MLP sizes of the configuration; the harness adds
  the optimizer, so every mode trains them the same way.
- ``dlrm_outside_scope``: DLRM whose tables the program keeps outside
  ``embedding_scope()``: plain TensorFlow tables in every mode, under
  ``scope()`` replicated on every worker and averaged like dense variables.
- ``embedding``: the embedding-only step. The tables' vectors (all 26, or the first ``tables``) and the 13
  dense features feed one linear layer: almost all parameters and all the
  traffic are in the tables.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Mapping, Tuple

import tensorflow as tf

from benchmarks.tables import table_sizes
from datasets import schema

Builder = Callable[[Mapping[str, tf.Tensor], tf.Tensor, Mapping[str, Any], bool], Tuple[tf.Tensor, tf.Tensor]]
APIS = ("feature_columns", "variables")


def zoo_params(params: Mapping[str, Any], sharded: bool) -> Dict[str, Any]:
    """The model zoo's ``params`` for a harness run: Criteo spec of the run's scale, dim, seed, MLPs, API."""
    from modelzoo.spec import FeatureSpec  # pylint: disable=import-outside-toplevel

    dim = int(params["dim"])
    spec = FeatureSpec(numeric=tuple(schema.DENSE), categorical=tuple(zip(schema.CATEGORICAL, table_sizes(params))),
                       labels=(schema.LABEL,))
    return {"spec": spec, "embedding_dim": dim, "task": "binary", "target": "label",
            "optimizer": "adagrad", "learning_rate": float(params["learning_rate"]), "seed": int(params["seed"]),
            "plain": not sharded, "embedding_api": params.get("api", "feature_columns"),
            "bottom_mlp": list(params.get("bottom_mlp", [64, 32])) + [dim],
            "top_mlp": list(params.get("top_mlp", [64, 32])) + [1],
            "dnn": list(params.get("dnn", [64, 32]))}


def embedding_only(features: Mapping[str, tf.Tensor], labels: tf.Tensor, params: Mapping[str, Any],
                   sharded: bool) -> Tuple[tf.Tensor, tf.Tensor]:
    """The embedding-only step: the tables (26, or the first ``tables``) and the dense features into one linear
    layer."""
    from modelzoo.features import embedding_layer, numeric_tensor  # pylint: disable=import-outside-toplevel

    zoo = zoo_params(params, sharded)
    vectors = embedding_layer(features, zoo["spec"], zoo["embedding_dim"], "embedding", zoo["seed"], stddev=0.05,
                              sharded=sharded, api=zoo["embedding_api"])
    inputs = tf.concat([tf.reshape(vectors, [-1, len(zoo["spec"].categorical) * zoo["embedding_dim"]]),
                        numeric_tensor(features, zoo["spec"])], axis=1)
    logits = tf.compat.v1.layers.dense(
        inputs, 1, name="head", kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=zoo["seed"]))[:, 0]
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return loss, tf.sigmoid(logits)


def _zoo(module: str) -> Builder:
    def build(features, labels, params, sharded):
        model_fn = importlib.import_module(module).model_fn
        spec = model_fn(dict(features), {"label": labels}, tf.estimator.ModeKeys.EVAL, zoo_params(params, sharded))
        return spec.loss, tf.reshape(spec.predictions["logistic"], [-1])  # the head's [B, 1] click probability

    build.__doc__ = f"{module}.model_fn's loss and probabilities (EVAL mode: the harness adds the optimizer)."
    return build


def _outside_scope(builder: Builder) -> Builder:
    def build(features, labels, params, sharded):
        del sharded
        return builder(features, labels, params, False)

    build.__doc__ = f"{builder.__doc__} Tables outside embedding_scope() in every mode."
    return build


MODELS: Dict[str, Builder] = {"dlrm": _zoo("modelzoo.dlrm.model"), "deepfm": _zoo("modelzoo.deepfm.model"),
                              "dlrm_outside_scope": _outside_scope(_zoo("modelzoo.dlrm.model")),
                              "embedding": embedding_only}


def get(name: str) -> Builder:
    """The builder called ``name``; the error lists the known ones."""
    if name not in MODELS:
        raise KeyError(f"unknown benchmark model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return MODELS[name]
