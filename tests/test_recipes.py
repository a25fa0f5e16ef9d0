"""The reference docs' complete programs (tests/recipes/, listed in its README), run as users run them.

DeepRec's two CollectiveStrategy examples (reference/collective-training.md) run here with TF1 behaviour, as
the TF 1.x programs they are, on hb and sok: the Estimator example trains, evaluates and exports on 2 workers,
and plain TensorFlow serves its export with the checkpoint's rows; the MonitoredTrainingSession example
trains on 1, 2 and 3 workers, and on 2 exports, its served rows equal to one plain TensorFlow process's.
HybridBackend's and SOK's recipes run in test_api_hb.py and test_api_sok.py, against one process.
"""

import glob
import os
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from launcher import RECIPES, run_workers

RATINGS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-latest-small" / "ratings.csv"
ESTIMATOR_STEPS = 5
MTS_IDS = [0, 1, 2, 5, 6, 7]


def serve(export_dir: str, feed: dict, output: str) -> np.ndarray:
    """``output`` of the SavedModel's default signature for ``feed`` (input name -> value), in plain TF."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        signature = tf.compat.v1.saved_model.load(sess, ["serve"], export_dir).signature_def["serving_default"]
        return sess.run(signature.outputs[output].name, {signature.inputs[k].name: v for k, v in feed.items()})


def only_export(base: pathlib.Path) -> str:
    found = glob.glob(str(base / "*" / "saved_model.pb"))
    assert len(found) == 1, found
    return os.path.dirname(found[0])


@pytest.fixture(scope="module", params=["hb", "sok"])
def deeprec_estimator(request, tmp_path_factory):
    """DeepRec's Estimator example with TF1 behaviour on 2 workers: train 5 steps, evaluate, export.

    Regression: with TF1 behaviour its export failed ("'RefVariable' object has no attribute 'handle'")."""
    if not RATINGS.exists():
        pytest.skip(f"MovieLens ratings not found at {RATINGS}")
    out = tmp_path_factory.mktemp(f"deeprec-estimator-{request.param}")
    run_workers(str(RECIPES / "deeprec_estimator.py"), 2, [out, RATINGS, ESTIMATOR_STEPS],
                env={"COLLECTIVE_STRATEGY": request.param}, timeout=600)
    return out


def test_deeprec_estimator_example_trains_evaluates_and_exports_with_tf1_behaviour(deeprec_estimator):
    model_dir = deeprec_estimator / "model"
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"model.ckpt-{ESTIMATOR_STEPS}")
    # Rank 0 alone writes event files: one for training, one for evaluation.
    assert len(glob.glob(str(model_dir / "events.out.tfevents.*"))) == 1
    assert len(glob.glob(str(model_dir / "eval" / "events.out.tfevents.*"))) == 1
    only_export(deeprec_estimator / "export")


def _hash_rows(checkpoint: str, table: str, ids: np.ndarray) -> np.ndarray:
    """The rows the checkpoint's hash table ``table`` holds for ``ids`` (zeros for keys it never saw)."""
    keys = tf.train.load_variable(checkpoint, f"{table}/keys")
    values = tf.train.load_variable(checkpoint, table)
    row_of = {int(k): i for i, k in enumerate(keys)}
    return np.stack([values[row_of[i]] if i in row_of else np.zeros(values.shape[1], values.dtype) for i in ids])


def test_deeprec_estimator_example_export_serves_the_checkpoint(deeprec_estimator):
    checkpoint = tf.train.latest_checkpoint(str(deeprec_estimator / "model"))
    movies, users = np.array([1, 3, 6, 47, 10**9]), np.array([1, 1, 2, 3, 10**9])  # the last ids never occur
    logits = serve(only_export(deeprec_estimator / "export"),
                   {"movie_id": movies, "user_id": users, "user_rating": np.zeros(5, np.float32)}, "logits")
    expected = 2.0 * np.concatenate(
        [_hash_rows(checkpoint, "embedding/input_layer/movie_id_embedding/embedding_weights", movies),
         _hash_rows(checkpoint, "embedding/input_layer_1/user_id_embedding/embedding_weights", users)], axis=1)
    assert np.abs(expected[:4]).sum() > 0  # trained rows, not the zeros of unseen keys
    np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-7)


def _plain_mts_rows() -> np.ndarray:
    """The example's table rows for MTS_IDS after its one step, in one plain TF1 process."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = tf.compat.v1.get_variable("var_1", shape=(1000, 3), initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(2.0 * tf.nn.embedding_lookup(var, tf.constant(MTS_IDS, tf.int64)))
        opt = tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=2.0, l2_regularization_strength=0.00001)
        train = opt.apply_gradients(opt.compute_gradients(loss))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        return sess.run(var)[MTS_IDS]


@pytest.mark.parametrize("backend", ["hb", "sok"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_deeprec_monitored_training_session_example(n, backend, tmp_path):
    """Prints the rows before the step and the loss; on 2 workers its export serves one process's rows."""
    args = [tmp_path] if n == 2 else []
    proc = run_workers(str(RECIPES / "deeprec_mts.py"), n, args, env={"COLLECTIVE_STRATEGY": backend})
    for r in range(n):
        lines = [l[len(f"[{r}] "):] for l in proc.stdout.splitlines() if l.startswith(f"[{r}] ")]
        text = " ".join(lines)
        numbers = [float(x) for x in re.findall(r"[-+]?\d+\.\d*", text)]
        assert numbers[:18] == [1.0] * 18, text  # six rows of var_1, all ones
        assert numbers[18] == 36.0, text         # sum(2 * emb)
    if n == 2:
        rows = serve(only_export(tmp_path / "export"), {"ids": np.array(MTS_IDS + [999])}, "emb")
        expected = _plain_mts_rows()
        assert not np.allclose(expected, 1.0)  # the step moved them
        np.testing.assert_allclose(rows[:-1], expected, rtol=1e-6)
        np.testing.assert_array_equal(rows[-1], 1.0)  # an untouched row
