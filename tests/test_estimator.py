"""strategy.estimator on 1, 2 and 3 workers against single-process TensorFlow.

One launch per (backend, workers) runs train (even and unequal shares, with
and without max_steps; batch norm on unequal shares), evaluate (unequal
shares, steps=None), predict, train_and_evaluate and a ThroughputHook under
MonitoredTrainingSession; the tests compare with plain TensorFlow training on
the global batch and plain single-process evaluation of all workers' data.
"""

import glob
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from launcher import load_rank_results, run_workers
from workers import estimator_cases as cases

# Every backend and 1, 2, 3 workers, without the full cross product (each launch costs ~20 s).
RUNS = [("hb", 1), ("sok", 2), ("hb", 3), ("replicated", 2)]
METRICS = ("loss", "auc", "accuracy", "mse")
RATINGS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-latest-small" / "ratings.csv"


@pytest.fixture(scope="module", params=RUNS, ids=lambda p: f"{p[0]}-{p[1]}workers")
def run(request, tmp_path_factory):
    backend, n = request.param
    out = tmp_path_factory.mktemp(f"est-{backend}-{n}")
    proc = run_workers("estimator_worker.py", n, [out, backend], env={"COLLECTIVE_STRATEGY": backend})
    return n, load_rank_results(out, n), proc


def logical_table(results, prefix, n):
    """The logical table from every worker's rows (each worker holds all of it under ``replicated``)."""
    if results[0][f"{prefix}/table"].shape == cases.TABLE.shape:
        for r in range(1, n):
            np.testing.assert_array_equal(results[r][f"{prefix}/table"], results[0][f"{prefix}/table"])
        return results[0][f"{prefix}/table"]
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


def test_batch_norm_on_the_empty_batches_of_unequal_shares_gives_no_nan(run):
    """Regression: a worker's empty padding batch gave NaN moving statistics (fused or not) and NaN gamma.

    Now an empty step leaves that worker's moving statistics as its own batches left them, and every
    worker's weights stay finite and equal."""
    n, res, _ = run
    longest = max(len(cases.uneven_batches(r, n)) for r in range(n))
    for r in range(n):
        assert res[r]["bn/global_step"] == longest
        for key, value in res[r].items():
            if key.startswith("bn/"):
                assert np.isfinite(value).all(), (r, key, value)
        expected = cases.reference_moving_statistics([batch["x"] for batch in cases.uneven_batches(r, n)])
        for name, value in expected.items():
            np.testing.assert_allclose(res[r][f"bn/{name}"], value, rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {name}")
        for layer in ("bn_fused", "bn_keras"):
            for name in ("gamma", "beta"):
                np.testing.assert_array_equal(res[r][f"bn/{layer}/{name}"], res[0][f"bn/{layer}/{name}"])


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


@pytest.fixture(scope="module", params=["hb", "sok"])
def reference_example(request, tmp_path_factory):
    """The reference Estimator example on 2 workers: train 5 steps, evaluate, export."""
    if not RATINGS.exists():
        pytest.skip(f"MovieLens ratings not found at {RATINGS}")
    out = tmp_path_factory.mktemp(f"reference-{request.param}")
    run_workers("reference_estimator.py", 2, [out, RATINGS, REFERENCE_STEPS],
                env={"COLLECTIVE_STRATEGY": request.param}, timeout=600)
    return out


REFERENCE_STEPS = 5


def test_reference_estimator_example_trains_evaluates_and_exports(reference_example):
    model_dir = reference_example / "model"
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"model.ckpt-{REFERENCE_STEPS}")
    # Rank 0 alone writes event files: one for training, one for evaluation.
    assert len(glob.glob(str(model_dir / "events.out.tfevents.*"))) == 1
    assert len(glob.glob(str(model_dir / "eval" / "events.out.tfevents.*"))) == 1
    assert len(glob.glob(str(reference_example / "export" / "*" / "saved_model.pb"))) == 1


def test_reference_estimator_example_export_serves(reference_example):
    export_dir = os.path.dirname(glob.glob(str(reference_example / "export" / "*" / "saved_model.pb"))[0])
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        signature = tf.compat.v1.saved_model.load(sess, ["serve"], export_dir).signature_def["serving_default"]
        feed = {signature.inputs["movie_id"].name: [1, 3, 6, 47, 10**9],  # the last ids never occur in the data
                signature.inputs["user_id"].name: [1, 1, 2, 3, 10**9],
                signature.inputs["user_rating"].name: np.zeros(5, np.float32)}
        logits = sess.run(signature.outputs["logits"].name, feed)
    assert logits.shape == (5, 32) and np.isfinite(logits).all()
    np.testing.assert_array_equal(logits[4], 0.0)  # unseen keys embed as zeros in inference


def test_predict_on_one_worker_says_every_worker_must_call_it(tmp_path):
    """Regression: predict on rank 0 alone ended with Horovod's bare "has been shut down"."""
    proc = run_workers("estimator_predict_alone.py", 2, [tmp_path / "model"], check=False, timeout=400)
    assert proc.returncode != 0
    assert "WorkersNotInStepError" in proc.stderr + proc.stdout, (proc.stdout[-3000:], proc.stderr[-5000:])
    assert "call them on every worker" in proc.stderr + proc.stdout


def test_shard_input_reaches_the_estimator_through_every_front_door(tmp_path):
    """Regression: docs/estimator.md offered shard_input=True, but strategy.estimator() took no such argument."""
    import collective.hb as hb
    from collective import CollectiveStrategy

    def model_fn(features, labels, mode, params):
        raise AssertionError("not called")

    made = [CollectiveStrategy().estimator(model_fn, str(tmp_path / "a"), shard_input=True, throughput_every_n_steps=7),
            hb.estimator.Estimator(model_fn, str(tmp_path / "b"), shard_input=True, throughput_every_n_steps=7)]
    for estimator in made:
        assert (estimator._shard_input, estimator._throughput_every) == (True, 7)  # pylint: disable=protected-access
    with pytest.raises(TypeError, match="warm_start_from"):
        hb.estimator.Estimator(model_fn, str(tmp_path / "c"), warm_start_from=str(tmp_path / "a"))
