"""DeepFM's ``model_fn``: linear + FM + DNN on shared embeddings, log loss.

    first order: a weight per id (26 sharded tables [vocab_i, 1]) + a linear layer on the 13 numeric features
    second order: FM on the 26 embeddings e_i [B, d]: 0.5 * sum_d((sum_i e_i)^2 - sum_i e_i^2)
    DNN: concat(e_1..e_26, numeric) -> 400-400-400 ReLU -> 1
    logit = first order + second order + DNN
"""

from __future__ import annotations

import argparse
from typing import Dict

import tensorflow as tf

from modelzoo import data as data_lib
from modelzoo import flags, heads
from modelzoo.features import embedding_layer, mlp, numeric_tensor
from modelzoo.runner import Recipe


def fm_second_order(embeddings: tf.Tensor) -> tf.Tensor:
    """``[B, F, d]`` -> ``[B]``: the sum of <e_i, e_j> over pairs i < j, in O(F d)."""
    square_of_sum = tf.square(tf.reduce_sum(embeddings, axis=1))
    sum_of_squares = tf.reduce_sum(tf.square(embeddings), axis=1)
    return 0.5 * tf.reduce_sum(square_of_sum - sum_of_squares, axis=1)


def model_fn(features, labels, mode, params):
    """DeepFM. ``params``: ``spec``, ``embedding_dim``, ``dnn``, ``seed`` and the head's keys."""
    spec, dim, seed = params["spec"], params["embedding_dim"], params.get("seed", 0)
    sharded = not params.get("plain")
    api = params.get("embedding_api", "variables")
    numeric = numeric_tensor(features, spec)
    weights = embedding_layer(features, spec, 1, "first_order", seed + 7, stddev=0.01, sharded=sharded, api=api)
    linear = tf.compat.v1.layers.dense(numeric, 1, name="first_order_numeric",
                                       kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
    first = tf.reduce_sum(weights, axis=[1, 2]) + tf.reshape(linear, [-1])
    embeddings = embedding_layer(features, spec, dim, "embedding", seed, stddev=params.get("embedding_stddev"),
                                 sharded=sharded, api=api)
    second = fm_second_order(embeddings)
    deep_in = tf.concat([tf.reshape(embeddings, [-1, embeddings.shape[1] * dim]), numeric], axis=1)
    deep = mlp(deep_in, list(params["dnn"]) + [1], "dnn", seed + 1, last_activation=False)
    return heads.estimator_spec(mode, first + second + tf.reshape(deep, [-1]), labels, params)


def _flags(p: argparse.ArgumentParser) -> None:
    flags.add_embedding_dim(p)
    p.add_argument("--dnn", type=flags.int_list, default=[400, 400, 400],
                   help="hidden layer sizes of the DNN (a final 1-unit layer follows)")
    flags.add_synthetic(p)


def _params(args, dataset) -> Dict[str, object]:
    return {"spec": dataset.spec, "embedding_dim": args.embedding_dim, "embedding_stddev": args.embedding_stddev,
            "dnn": list(args.dnn), "task": "binary",
            "target": "label", "optimizer": args.optimizer, "learning_rate": args.learning_rate, "seed": args.seed,
            "plain": args.plain}


RECIPE = Recipe(
    name="deepfm", description=__doc__.splitlines()[0], model_fn=model_fn,
    defaults={"batch_size": 1024, "steps": 600, "learning_rate": 0.05, "optimizer": "adagrad",
              "shuffle_buffer": 0, "model_dir": data_lib.DEFAULT_CACHE + "/runs/deepfm",
              "data_help": data_lib.SYNTHETIC_HELP},
    add_flags=_flags, load_data=data_lib.load_synthetic, params=_params)
