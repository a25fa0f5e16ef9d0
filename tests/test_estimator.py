"""strategy.estimator on 1, 2 and 3 workers against single-process TensorFlow.

One launch per (backend, workers) runs train (even and unequal shares, with
and without max_steps), evaluate (unequal shares, steps=None), predict,
train_and_evaluate and a ThroughputHook under MonitoredTrainingSession; the
tests compare with plain TensorFlow training on the global batch and plain
single-process evaluation of all workers' data.
"""

import glob
import importlib.util
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from launcher import load_rank_results, run_workers
from workers import estimator_cases as cases

# Both backends and 1, 2, 3 workers, without the full cross product (each launch costs ~20 s).
RUNS = [("hb", 1), ("hb", 2), ("sok", 2), ("sok", 3)]
METRICS = ("loss", "auc", "accuracy", "mse")
RATINGS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-latest-small" / "ratings.csv"


@pytest.fixture(scope="module", params=RUNS, ids=lambda p: f"{p[0]}-{p[1]}workers")
def run(request, tmp_path_factory):
    backend, n = request.param
    out = tmp_path_factory.mktemp(f"est-{backend}-{n}")
    proc = run_workers("estimator_worker.py", n, [out, backend], env={"COLLECTIVE_STRATEGY": backend})
    return n, load_rank_results(out, n), proc


def logical_table(results, prefix, n):
    table = np.zeros_like(cases.TABLE)
    for r in range(n):
        table[r::n] = results[r][f"{prefix}/table"]
    return table


def trained(results, prefix, n):
    """(table, w, b) of a run, after checking that dense weights agree on every worker."""
    for r in range(1, n):
        np.testing.assert_array_equal(results[r][f"{prefix}/w"], results[0][f"{prefix}/w"])
        np.testing.assert_array_equal(results[r][f"{prefix}/b"], results[0][f"{prefix}/b"])
    return logical_table(results, prefix, n), results[0][f"{prefix}/w"], results[0][f"{prefix}/b"]


def assert_weights(actual, expected):
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def even_steps(n, steps):
    return [[cases.even_batches(r, n, steps)[s] for r in range(n)] for s in range(steps)]


def uneven_steps(n, steps):
    shares = [cases.uneven_batches(r, n) for r in range(n)]
    return [[share[s] if s < len(share) else cases.concat([]) for share in shares] for s in range(steps)]


def all_eval_batches(n):
    return [batch for r in range(n) for batch in cases.eval_batches(r, n)]


def test_train_equals_single_process_training_on_the_global_batch(run):
    n, res, _ = run
    for r in range(n):
        assert res[r]["even/global_step"] == cases.EVEN_STEPS
    assert_weights(trained(res, "even", n), cases.reference_train(even_steps(n, cases.EVEN_STEPS), n))


def test_unequal_shares_stop_together_when_every_worker_is_out(run):
    n, res, _ = run
    longest = max(len(cases.uneven_batches(r, n)) for r in range(n))
    for r in range(n):
        assert res[r]["uneven/global_step"] == longest
        assert res[r]["uneven_max/global_step"] == 2
    assert_weights(trained(res, "uneven", n), cases.reference_train(uneven_steps(n, longest), n))
    assert_weights(trained(res, "uneven_max", n), cases.reference_train(uneven_steps(n, 2), n))


def test_evaluate_gives_global_metrics_on_every_worker(run):
    n, res, _ = run
    expected = cases.reference_eval(all_eval_batches(n), *trained(res, "even", n))
    for r in range(n):
        for key in METRICS:
            np.testing.assert_allclose(res[r][f"even_eval/{key}"], expected[key], rtol=1e-5, err_msg=key)
        assert res[r]["even_eval/global_step"] == cases.EVEN_STEPS


def test_predict_yields_each_workers_own_predictions(run):
    n, res, _ = run
    weights = trained(res, "even", n)
    for r in range(n):
        mine = cases.concat(cases.eval_batches(r, n))
        np.testing.assert_array_equal(res[r]["predict/item"], mine["item"])
        np.testing.assert_allclose(res[r]["predict/logits"], cases.reference_logits(mine, *weights), rtol=1e-5,
                                   atol=1e-6)


def test_train_and_evaluate_method(run):
    n, res, _ = run
    weights = trained(res, "tae", n)
    assert_weights(weights, cases.reference_train(even_steps(n, 3), n))
    expected = cases.reference_eval(all_eval_batches(n), *weights)
    for r in range(n):
        assert res[r]["tae/global_step"] == 3
        for key in METRICS:
            np.testing.assert_allclose(res[r][f"tae_eval/{key}"], expected[key], rtol=1e-5, err_msg=key)


def test_throughput_hook_counts_samples_and_bytes(run):
    n, res, proc = run
    for r in range(n):
        np.testing.assert_array_equal(res[r]["even/records_steps"], np.arange(1, cases.EVEN_STEPS + 1))
        np.testing.assert_array_equal(res[r]["even/records_samples"], [cases.GLOBAL_BATCH] * cases.EVEN_STEPS)
        # Dense model: one grouped allreduce of w [4, 1] and b [1] (float32) per step, 2 rows per worker.
        np.testing.assert_array_equal(res[r]["mts/step"], [2, 4, 5])
        steps = res[r]["mts/steps"]
        np.testing.assert_array_equal(steps, [2, 2, 1])
        np.testing.assert_array_equal(res[r]["mts/samples"], steps * 2 * n)
        per_worker_step = 16 * 2 * (n - 1) // n + 4 * 2 * (n - 1) // n
        np.testing.assert_array_equal(res[r]["mts/bytes"], steps * n * per_worker_step)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "samples/s (global" in line]
    assert lines and all(line.startswith("[0] ") for line in lines)


@pytest.mark.skipif(not RATINGS.exists(), reason=f"MovieLens ratings not found at {RATINGS}")
@pytest.mark.skipif(importlib.util.find_spec("collective.export") is None,
                    reason="collective.export (SavedModel export) has not landed; the example ends with an export")
@pytest.mark.parametrize("backend", ["hb", "sok"])
def test_reference_estimator_example_trains_evaluates_exports_and_serves(backend, tmp_path):
    max_steps = 5
    run_workers("reference_estimator.py", 2, [tmp_path, RATINGS, max_steps], env={"COLLECTIVE_STRATEGY": backend},
                timeout=600)
    model_dir = tmp_path / "model"
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"model.ckpt-{max_steps}")
    # Rank 0 alone writes event files: one for training, one for evaluation.
    assert len(glob.glob(str(model_dir / "events.out.tfevents.*"))) == 1
    assert len(glob.glob(str(model_dir / "eval" / "events.out.tfevents.*"))) == 1
    exports = sorted(glob.glob(str(tmp_path / "export" / "*" / "saved_model.pb")))
    assert len(exports) == 1
    serve = tf.saved_model.load(os.path.dirname(exports[0])).signatures["serving_default"]
    ids = tf.constant([1, 3, 6, 47, 10**9], tf.int64)  # the last id never occurs in the data
    out = serve(movie_id=ids, user_id=tf.constant([1, 1, 2, 3, 10**9], tf.int64),
                user_rating=tf.zeros([5], tf.float32))
    logits = next(iter(out.values())).numpy()
    assert logits.shape == (5, 32) and np.isfinite(logits).all()
