"""DLRM's ``model_fn``: bottom MLP on the numeric features, pairwise dot interaction, top MLP.

    dense [B, 13] -> bottom MLP (512-256-64-16) -> x [B, d]
    C1..C26 -> 26 sharded tables [vocab_i, d] -> e_1..e_26 [B, d]
    z = the 351 dot products <v_i, v_j>, i < j, of v = (x, e_1..e_26)
    top MLP (512-256-1) on concat(x, z) -> logit; log loss

The last bottom layer must equal the embedding dimension ``d``.
"""

from __future__ import annotations

import argparse
from typing import Dict

import tensorflow as tf

from modelzoo import data as data_lib
from modelzoo import flags, heads
from modelzoo.features import embedding_layer, mlp, numeric_tensor
from modelzoo.runner import Recipe


def dot_interaction(vectors: tf.Tensor) -> tf.Tensor:
    """``[B, F, d]`` -> ``[B, F*(F-1)/2]``: the dot products of every pair of the F vectors (strict lower triangle)."""
    num = int(vectors.shape[1])
    gram = tf.matmul(vectors, vectors, transpose_b=True)
    rows, cols = zip(*[(i, j) for i in range(num) for j in range(i)])
    flat = tf.reshape(gram, [-1, num * num])
    return tf.gather(flat, [i * num + j for i, j in zip(rows, cols)], axis=1)


def model_fn(features, labels, mode, params):
    """DLRM. ``params``: ``spec``, ``embedding_dim``, ``bottom_mlp``, ``top_mlp``, ``seed`` and the head's keys."""
    spec, dim, seed = params["spec"], params["embedding_dim"], params.get("seed", 0)
    if params["bottom_mlp"][-1] != dim:
        raise ValueError(f"DLRM's last bottom layer ({params['bottom_mlp'][-1]}) must equal --embedding_dim "
                         f"({dim}): its output is dotted with the embeddings")
    if params["top_mlp"][-1] != 1:
        raise ValueError(f"DLRM's last top layer ({params['top_mlp'][-1]}) must be 1: it is the logit "
                         f"(e.g. --top_mlp {','.join(map(str, params['top_mlp']))},1)")
    x = mlp(numeric_tensor(features, spec), params["bottom_mlp"], "bottom_mlp", seed)
    embeddings = embedding_layer(features, spec, dim, "embedding", seed, stddev=params.get("embedding_stddev"),
                                 sharded=not params.get("plain"),
                                 api=params.get("embedding_api", "variables"))
    interactions = dot_interaction(tf.concat([x[:, None, :], embeddings], axis=1))
    logit = mlp(tf.concat([x, interactions], axis=1), params["top_mlp"], "top_mlp", seed + 1,
                last_activation=False)
    return heads.estimator_spec(mode, logit, labels, params)


def _flags(p: argparse.ArgumentParser) -> None:
    flags.add_embedding_dim(p)
    p.add_argument("--bottom_mlp", type=flags.int_list, default=[512, 256, 64, 16],
                   help="bottom MLP layer sizes (the last equals --embedding_dim)")
    p.add_argument("--top_mlp", type=flags.int_list, default=[512, 256, 1], help="top MLP layer sizes (the last is 1)")
    flags.add_synthetic(p)


def _params(args, dataset) -> Dict[str, object]:
    return {"spec": dataset.spec, "embedding_dim": args.embedding_dim, "embedding_stddev": args.embedding_stddev,
            "bottom_mlp": list(args.bottom_mlp),
            "top_mlp": list(args.top_mlp), "task": "binary", "target": "label", "optimizer": args.optimizer,
            "learning_rate": args.learning_rate, "seed": args.seed, "plain": args.plain}


RECIPE = Recipe(
    name="dlrm", description=__doc__.splitlines()[0], model_fn=model_fn,
    defaults={"batch_size": 1024, "steps": 900, "learning_rate": 0.1, "optimizer": "adagrad",
              "shuffle_buffer": 0, "model_dir": data_lib.DEFAULT_CACHE + "/runs/dlrm",
              "data_help": data_lib.SYNTHETIC_HELP},
    add_flags=_flags, load_data=data_lib.load_synthetic, params=_params)
