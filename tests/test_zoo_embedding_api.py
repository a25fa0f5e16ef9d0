"""The model zoo's two embedding APIs build the same model: stock feature columns (``input_layer`` of
``embedding_column``s, the benchmarks' Estimator baseline) and ``get_variable`` tables with the coalesced
lookup give equal losses before and after training, for DLRM and DeepFM, in one process."""

import numpy as np
import pytest
import tensorflow as tf

from modelzoo.deepfm.model import model_fn as deepfm_fn
from modelzoo.dlrm.model import model_fn as dlrm_fn
from modelzoo.repository import import_datasets
from modelzoo.spec import criteo_spec

datasets = import_datasets()


def _losses(model_fn, api: str, extra: dict, feats, labels):
    spec = criteo_spec(datasets.synthetic.cardinalities(0.001))
    with tf.Graph().as_default():
        params = {"spec": spec, "embedding_dim": 8, "task": "binary", "target": "label", "optimizer": "adagrad",
                  "learning_rate": 0.1, "seed": 3, "plain": True, "embedding_api": api, **extra}
        est = model_fn({k: tf.constant(v) for k, v in feats.items()}, {"label": tf.constant(labels)},
                       tf.estimator.ModeKeys.TRAIN, params)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [sess.run(est.loss)]
            for _ in range(3):
                sess.run(est.train_op)
            losses.append(sess.run(est.loss))
    return np.array(losses)


def _batch(rows: int, seed: int):
    """(spec, features, labels): a random Criteo-shaped batch over the tiny synthetic tables."""
    rng = np.random.default_rng(seed)
    spec = criteo_spec(datasets.synthetic.cardinalities(0.001))
    feats = {n: rng.normal(size=rows).astype(np.float32) for n in datasets.schema.DENSE}
    feats.update({n: rng.integers(0, v, rows) for n, v in spec.categorical})
    return spec, feats, rng.integers(0, 2, rows).astype(np.float32)


@pytest.mark.parametrize("model_fn,extra", [(dlrm_fn, {"bottom_mlp": [16, 8], "top_mlp": [8, 1]}),
                                            (deepfm_fn, {"dnn": [8]})], ids=["dlrm", "deepfm"])
def test_feature_columns_train_the_same_model_as_variables(model_fn, extra):
    _, feats, labels = _batch(64, 0)
    variables = _losses(model_fn, "variables", extra, feats, labels)
    columns = _losses(model_fn, "feature_columns", extra, feats, labels)
    assert variables[1] < variables[0]  # it trained
    np.testing.assert_allclose(columns, variables, rtol=1e-5)


def test_unknown_embedding_api_is_refused():
    from modelzoo.features import embedding_layer  # pylint: disable=import-outside-toplevel

    with pytest.raises(ValueError, match="embedding api 'keras'"):
        embedding_layer({}, criteo_spec([2] * 26), 4, "e", 0, api="keras")


def test_constant_api_is_the_model_without_tables():
    """``embedding_api="constant"`` (the benchmarks' embedding-free ceiling) builds DLRM's dense layers only, and
    its loss is the loss of DLRM whose every table row holds the feature's constant vector."""
    from modelzoo.features import _constant_embeddings  # pylint: disable=import-outside-toplevel

    spec, feats, labels = _batch(32, 1)
    params = {"spec": spec, "embedding_dim": 4, "task": "binary", "target": "label", "optimizer": "adagrad",
              "learning_rate": 0.1, "seed": 5, "plain": True, "bottom_mlp": [8, 4], "top_mlp": [8, 1]}
    losses, names = {}, {}
    for api in ("constant", "variables"):
        with tf.Graph().as_default():
            est = dlrm_fn({k: tf.constant(v) for k, v in feats.items()}, {"label": tf.constant(labels)},
                          tf.estimator.ModeKeys.TRAIN, dict(params, embedding_api=api))
            names[api] = {v.op.name for v in tf.compat.v1.trainable_variables()}
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                if api == "variables":
                    vectors = sess.run(_constant_embeddings(feats, [n for n, _ in spec.categorical], 4, 5, None))
                    tables = [v for v in tf.compat.v1.trainable_variables() if v.op.name.startswith("embedding/")]
                    assert len(tables) == len(spec.categorical)
                    for i, (name, vocab) in enumerate(spec.categorical):
                        table = next(t for t in tables if t.op.name == f"embedding/{name}")
                        table.load(np.tile(vectors[0, i], (vocab, 1)), sess)
                losses[api] = sess.run(est.loss)
    assert names["constant"] and not any(n.startswith("embedding/") for n in names["constant"])
    assert names["constant"] == {n for n in names["variables"] if not n.startswith("embedding/")}
    np.testing.assert_allclose(losses["constant"], losses["variables"], rtol=1e-5)
