"""MovieLens' ``model_fn``: biased matrix factorisation with implicit feedback (SVD++) and genre-aware movies.

    score = mu + b_user + b_movie + <p_user + |N(u)|^-1/2 sum_{j in N(u)} y_j, q_movie + mean of its genre vectors>

N(u) is the set of movies the user rated in the training data (``--implicit``;
read from the training files when the graph is built, so the N workers build
the same constant). ``p``, ``q``, ``y`` (and the biases, tables of dimension 1)
are sharded tables; the genre vectors are one small replicated ``[genres, d]``
variable. The factors and biases have their own L2 (``--l2``, ``--bias_l2``);
the learning rate decays along a half cosine (``--final_lr``).
``--task rating`` fits the rating (squared error, RMSE; predictions clipped
to [0.5, 5]) and scores AUC of the prediction against ``label`` (rating >= 4);
``--task click`` fits ``label`` with log loss (AUC).

Why this model: ml-latest-small has 100k ratings of 610 users, no user side
features, and genres as the only movie feature. Biased MF is the model the
published RMSEs (0.87-0.90) are for, and SVD++'s implicit feedback
(which movies a user chose to rate) is the best-known gain on it; deep models (NeuMF, two towers) overfit
this little data and are built for ranking/retrieval rather than rating
prediction. Genres help movies with few ratings.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Dict, Sequence, Tuple

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf

from collective import CollectiveStrategy
from collective.embedding.lookup import lookup_sparse_group
from modelzoo import data as data_lib
from modelzoo import heads
from modelzoo.features import embedding_layer
from modelzoo.runner import Recipe

TASKS = {"rating": ("regression", "rating"), "click": ("binary", "label")}


def user_items(train_files: Sequence[str], users: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(row_splits, items)``: the movies each user rated in the training files, user by user (CSR)."""
    table = pq.read_table(list(train_files), columns=["user_id", "item_id"])
    user, item = table.column("user_id").to_numpy(), table.column("item_id").to_numpy()
    order = np.lexsort((item, user))
    splits = np.zeros(users + 1, np.int64)
    np.cumsum(np.bincount(user, minlength=users), out=splits[1:])
    return splits, item[order].astype(np.int64)


def implicit_feedback(user_ids: tf.Tensor, rated: Tuple[np.ndarray, np.ndarray], table: tf.Variable) -> tf.Tensor:
    """``[batch, d]``: SVD++'s ``|N(u)|^-1/2 * sum of y_j over the movies j in N(u)``, N(u) from ``rated``."""
    splits, items = rated
    per_user = tf.RaggedTensor.from_row_splits(tf.constant(items), tf.constant(splits), validate=False)
    users, at = tf.unique(tf.reshape(tf.cast(user_ids, tf.int64), [-1]))  # a user's N(u) is looked up once
    sums = lookup_sparse_group([table], [tf.gather(per_user, users).to_sparse()], combiners=["sqrtn"],
                               name="implicit_lookup", pad_to_batch=True)[0]
    return tf.gather(sums, at)


def model_fn(features, labels, mode, params):
    """Biased MF (SVD++ with ``rated``). ``params``: ``spec``, ``embedding_dim``, ``l2``, ``bias_l2``, ``mean``,
    ``rated`` (:func:`user_items`, or None), ``seed`` and the head's keys."""
    spec, dim, seed = params["spec"], params["embedding_dim"], params.get("seed", 0)
    sharded = not params.get("plain")
    ids = ["user_id", "item_id"]
    user, item = tf.unstack(embedding_layer(features, spec, dim, "factors", seed, ids, stddev=0.05,
                                            sharded=sharded), axis=1)
    if params.get("rated") is not None:
        with tf.compat.v1.variable_scope("implicit"), \
                (CollectiveStrategy().embedding_scope() if sharded else contextlib.nullcontext()):
            y = tf.compat.v1.get_variable("item_id", [spec.vocab("item_id"), dim],
                                          initializer=tf.compat.v1.truncated_normal_initializer(
                                              stddev=0.05, seed=seed + 3))
        user = user + implicit_feedback(features["user_id"], params["rated"], y)
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
    l2 = tf.reduce_mean(params["l2"] * tf.reduce_sum(tf.square(user) + tf.square(item), axis=1)
                        + params.get("bias_l2", params["l2"]) * tf.reduce_sum(tf.square(biases), axis=[1, 2]))
    return heads.estimator_spec(mode, score, labels, {**params, "learning_rate": learning_rate(params)},
                                extra_loss=l2)


def learning_rate(params) -> tf.Tensor:
    """``learning_rate``, decayed along a half cosine to ``learning_rate * final_lr`` at step ``steps``
    (constant when ``final_lr`` is 1)."""
    if params.get("final_lr", 1.0) == 1.0:
        return params["learning_rate"]
    return tf.compat.v1.train.cosine_decay(params["learning_rate"], tf.compat.v1.train.get_or_create_global_step(),
                                           params["steps"], alpha=params["final_lr"])


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=sorted(TASKS), default="rating",
                   help="rating: squared error on the rating (RMSE); click: log loss on rating >= 4 (AUC)")
    p.add_argument("--embedding_dim", type=int, default=32, help="dimension of the user and movie factors")
    p.add_argument("--l2", type=float, default=0.07,
                   help="L2 penalty on the user and movie vectors of each example (mean over the batch)")
    p.add_argument("--bias_l2", type=float, default=0.01,
                   help="L2 penalty on the user and movie biases of each example (mean over the batch)")
    p.add_argument("--final_lr", type=float, default=0.1,
                   help="the learning rate decays along a half cosine to this fraction of --learning_rate at "
                        "--steps (1: constant)")
    p.add_argument("--implicit", action=argparse.BooleanOptionalAction, default=True,
                   help="SVD++ implicit feedback: add to each user's vector the normalised sum of a learned "
                        "vector per movie the user rated in the training data")


def _params(args, dataset) -> Dict[str, object]:
    task, target = TASKS[args.task]
    rated = user_items(dataset.train, dataset.spec.vocab("user_id")) if args.implicit else None
    return {"spec": dataset.spec, "embedding_dim": args.embedding_dim, "l2": args.l2, "bias_l2": args.bias_l2,
            "rated": rated, "final_lr": args.final_lr, "steps": args.steps, "task": task,
            "target": target, "auc_label": "label", "value_range": (0.5, 5.0) if task == "regression" else None,
            "mean": 3.5 if task == "regression" else 0.0, "optimizer": args.optimizer,
            "learning_rate": args.learning_rate, "seed": args.seed, "plain": args.plain}


def _load(args, rank):
    return data_lib.movielens(args.data, rank)


RECIPE = Recipe(
    name="movielens", description=__doc__.splitlines()[0], model_fn=model_fn,
    defaults={"batch_size": 1024, "steps": 1000, "learning_rate": 0.002, "optimizer": "adam",
              "shuffle_buffer": 1 << 20, "model_dir": data_lib.DEFAULT_CACHE + "/runs/movielens",
              "data_help": "MovieLens: a directory converted by python -m datasets.movielens (train.parquet, "
                           f"test.parquet, meta.json) or a raw GroupLens release (default: {data_lib.MOVIELENS_SMALL}"
                           " when present)"},
    add_flags=_flags, load_data=_load, params=_params)
