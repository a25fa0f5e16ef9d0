"""MovieLens' ``model_fn``: biased matrix factorisation with genre-aware movie vectors.

    score = mu + b_user + b_movie + <p_user, q_movie + mean of the movie's genre vectors>

``p`` and ``q`` (and the biases, tables of dimension 1) are sharded tables;
the genre vectors are one small replicated ``[genres, d]`` variable.
``--task rating`` fits the rating (squared error, RMSE; predictions clipped
to [0.5, 5]) and scores AUC of the prediction against ``label`` (rating >= 4);
``--task click`` fits ``label`` with log loss (AUC).

Why this model: ml-latest-small has 100k ratings of 610 users, no user side
features, and genres as the only movie feature. Biased MF is the model the
published RMSEs (0.87-0.90) are for; deep models (NeuMF, two towers) overfit
this little data and are built for ranking/retrieval rather than rating
prediction. Genres help movies with few ratings.
"""

from __future__ import annotations

import argparse
from typing import Dict

import tensorflow as tf

from modelzoo import data as data_lib
from modelzoo import heads
from modelzoo.features import embedding_layer
from modelzoo.runner import Recipe

TASKS = {"rating": ("regression", "rating"), "click": ("binary", "label")}


def model_fn(features, labels, mode, params):
    """Biased MF. ``params``: ``spec``, ``embedding_dim``, ``l2``, ``mean``, ``seed`` and the head's keys."""
    spec, dim, seed = params["spec"], params["embedding_dim"], params.get("seed", 0)
    sharded = not params.get("plain")
    ids = ["user_id", "item_id"]
    user, item = tf.unstack(embedding_layer(features, spec, dim, "factors", seed, ids, stddev=0.05,
                                            sharded=sharded), axis=1)
    biases = embedding_layer(features, spec, 1, "biases", seed + 1, ids, stddev=0.01, sharded=sharded)
    if spec.multi_hot:
        name, size = spec.multi_hot[0]
        genre_table = tf.compat.v1.get_variable(
            "genre_factors", [size, dim], initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05,
                                                                                               seed=seed + 2))
        multi_hot = features[name]
        count = tf.maximum(tf.reduce_sum(multi_hot, axis=1, keepdims=True), 1.0)
        item = item + tf.matmul(multi_hot, genre_table) / count
    mu = tf.compat.v1.get_variable("global_bias", [], initializer=tf.compat.v1.constant_initializer(params["mean"]))
    score = mu + tf.reduce_sum(biases, axis=[1, 2]) + tf.reduce_sum(user * item, axis=1)
    l2 = params["l2"] * tf.reduce_mean(tf.reduce_sum(tf.square(user) + tf.square(item), axis=1)
                                       + tf.reduce_sum(tf.square(biases), axis=[1, 2]))
    return heads.estimator_spec(mode, score, labels, params, extra_loss=l2)


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=sorted(TASKS), default="rating",
                   help="rating: squared error on the rating (RMSE); click: log loss on rating >= 4 (AUC)")
    p.add_argument("--embedding_dim", type=int, default=32, help="dimension of the user and movie factors")
    p.add_argument("--l2", type=float, default=0.05,
                   help="L2 penalty on the factors and biases of each example (mean over the batch)")


def _params(args, dataset) -> Dict[str, object]:
    task, target = TASKS[args.task]
    return {"spec": dataset.spec, "embedding_dim": args.embedding_dim, "l2": args.l2, "task": task,
            "target": target, "auc_label": "label", "value_range": (0.5, 5.0) if task == "regression" else None,
            "mean": 3.5 if task == "regression" else 0.0, "optimizer": args.optimizer,
            "learning_rate": args.learning_rate, "seed": args.seed, "plain": args.plain}


def _load(args, rank):
    return data_lib.movielens(args.data, rank)


RECIPE = Recipe(
    name="movielens", description=__doc__.splitlines()[0], model_fn=model_fn,
    defaults={"batch_size": 1024, "steps": 800, "learning_rate": 0.002, "optimizer": "adam",
              "shuffle_buffer": 1 << 20, "model_dir": data_lib.DEFAULT_CACHE + "/runs/movielens",
              "data_help": "MovieLens: a directory converted by python -m datasets.movielens (train.parquet, "
                           f"test.parquet, meta.json) or a raw GroupLens release (default: {data_lib.MOVIELENS_SMALL}"
                           " when present)"},
    add_flags=_flags, load_data=_load, params=_params)
