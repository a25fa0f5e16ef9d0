"""strategy.estimator on 1, 2 and 3 workers against single-process TensorFlow.

One launch per (backend, workers) runs train (even and unequal shares, with
and without max_steps; batch norm on unequal shares), evaluate (unequal
shares, steps=None), predict, train_and_evaluate, incremental checkpoints
(a delta every step, a restarted train resuming from the chain, evaluate of
the chain end; then the previous launch's chain resumed on this worker count)
and a ThroughputHook under MonitoredTrainingSession; the tests compare with
plain TensorFlow training on the global batch and plain single-process
evaluation of all workers' data.
"""

import functools
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from launcher import launch_once, load_rank_results, run_together, run_workers
from workers import estimator_cases as cases

# Every backend and 1, 2, 3 workers, without the full cross product (each launch costs ~20 s).
RUNS = [("sok", 2), ("hb", 3), ("hb", 1), ("replicated", 2)]
# Each of these launches resumes the incremental checkpoint chain of the launch named: 2 -> 3 -> 1 -> 2 workers.
PREVIOUS = {("hb", 3): ("sok", 2), ("hb", 1): ("hb", 3), ("replicated", 2): ("hb", 1)}
# Keras metrics too: summed by name, not by their order in METRIC_VARIABLES (which differs between processes).
METRICS = ("loss", "auc", "accuracy", "mse", "label_mean", "logit_mean", "keras_auc", "keras_accuracy")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("est")


@launch_once
def _launch(base, backend, n):
    """(n, rank results, process) of the launch; its folder is ``process.out_dir``."""
    previous = PREVIOUS.get((backend, n))
    if previous is not None:
        _launch(base, *previous)
    out = base / f"{backend}-{n}"
    out.mkdir()

    def launch():
        return run_workers("estimator_worker.py", n, [out, backend, base / "-".join(map(str, previous)) if previous
                                                      else "-"], env={"COLLECTIVE_STRATEGY": backend}, timeout=600)

    if n == 1:  # a one-worker launch leaves a core idle: the canned estimators' 2-worker launch runs beside it
        canned_reference(base / "canned")
        (ok, proc), _ = run_together([launch, lambda: canned_launch(base / "canned", 2)])  # canned_launch keeps its own
        if not ok:
            raise proc
    else:
        proc = launch()
    proc.out_dir = out
    return n, load_rank_results(out, n), proc


@pytest.fixture(scope="module", params=RUNS, ids=lambda p: f"{p[0]}-{p[1]}workers")
def run(request, base):
    return _launch(base, *request.param)


def logical_table(results, prefix, n, name="table"):
    """The logical table (or its slot ``name``) from every worker's rows (each holds all of it under ``replicated``)."""
    key = f"{prefix}/{name}"
    if results[0][key].shape == cases.TABLE.shape:
        for r in range(1, n):
            np.testing.assert_array_equal(results[r][key], results[0][key])
        return results[0][key]
    table = np.zeros_like(cases.TABLE)
    for r in range(n):
        table[r::n] = results[r][key]
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


def assert_state(results, prefix, n, expected, what):
    """Table, w, b and their Adagrad slots of every worker equal ``expected`` (cases.reference_state)."""
    for name, value in expected.items():
        if name.startswith("table"):
            got = logical_table(results, prefix, n, name)
        else:
            got = results[0][f"{prefix}/{name}"]
            for r in range(1, n):
                np.testing.assert_array_equal(results[r][f"{prefix}/{name}"], got, err_msg=f"{what} {name} rank {r}")
        np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=f"{what}: {name}")


def delta_manifest(model_dir, step):
    return json.loads((model_dir / f"model.ckpt-{step}.delta.manifest.json").read_text())


def test_incremental_checkpoints_resume_a_restarted_train_and_evaluate_the_chain_end(run):
    """incremental_save_steps=1 and no full saves: a full checkpoint at step 1, then deltas; a second train()
    resumes from the chain's last step (2); evaluate() reads the chain end (step 4), not the full checkpoint."""
    n, res, proc = run
    for r in range(n):
        assert res[r]["inc_start/global_step"] == 2 and res[r]["inc/global_step"] == 4
        assert res[r]["inc_eval/global_step"] == 4
    steps = even_steps(n, cases.EVEN_STEPS)
    assert_state(res, "inc_start", n, cases.reference_state(steps[:2], n, cases.adagrad), "restored at step 2")
    expected = cases.reference_state(steps, n, cases.adagrad)
    assert_state(res, "inc", n, expected, "after the resumed train")
    metrics = cases.reference_eval(all_eval_batches(n), expected["table"], expected["w"], expected["b"])
    for r in range(n):
        for key in METRICS:
            np.testing.assert_allclose(res[r][f"inc_eval/{key}"], metrics[key], rtol=1e-5, err_msg=key)
    model_dir = proc.out_dir / "inc"
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-1")
    for step in (2, 3, 4):
        manifest = delta_manifest(model_dir, step)
        assert manifest["world_size"] == n and manifest["base"]["prefix"] == "model.ckpt-1"
        assert manifest["previous"] == (f"model.ckpt-{step - 1}.delta" if step > 2 else None)


@pytest.mark.parametrize("target", sorted(PREVIOUS), ids=lambda t: f"{t[0]}-{t[1]}workers")
def test_estimator_chain_of_n_workers_resumes_on_m_with_the_incremental_hook_among_chief_hooks(base, target):
    """The previous launch's chain (N workers, step 4) restored by train() on M workers: variables and Adagrad
    slots right after the restore equal plain TensorFlow's after 4 steps, and after one more step its 5; the
    chief hook saved a delta on every worker."""
    n, res, proc = _launch(base, *target)
    previous = PREVIOUS[target][1]
    steps = even_steps(n, cases.EVEN_STEPS)
    for r in range(n):
        assert res[r]["resume_start/global_step"] == 4 and res[r]["resume/global_step"] == 5
    what = f"chain of {previous} workers on {n}"
    assert_state(res, "resume_start", n, cases.reference_state(steps, n, cases.adagrad), what)
    assert_state(res, "resume", n, cases.reference_state(steps + steps[:1], n, cases.adagrad), f"{what}, a step on")
    manifest = delta_manifest(proc.out_dir / "resume", 5)
    assert manifest["world_size"] == n and manifest["previous"] == "model.ckpt-4.delta"
    assert delta_manifest(proc.out_dir / "resume", 4)["world_size"] == previous


def test_estimator_incremental_arguments_and_export_of_a_delta_are_refused(tmp_path):
    from collective import CollectiveStrategy

    def model_fn(features, labels, mode, params):
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="at most one of incremental_save_steps and incremental_save_secs"):
        CollectiveStrategy().estimator(model_fn, str(tmp_path), incremental_save_steps=1, incremental_save_secs=1)
    est = CollectiveStrategy().estimator(model_fn, str(tmp_path), incremental_save_secs=60)
    with pytest.raises(ValueError, match=r"exports full checkpoints; .*model.ckpt-3.delta is an incremental"):
        est.export_saved_model(str(tmp_path / "export"), lambda: None,
                               checkpoint_path=str(tmp_path / "model.ckpt-3.delta"))


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
    warm = hb.estimator.Estimator(model_fn, str(tmp_path / "c"), warm_start_from=str(tmp_path / "a"))
    assert warm.estimator._warm_start_settings.ckpt_to_initialize_from == str(tmp_path / "a")  # pylint: disable=protected-access
    with pytest.raises(TypeError, match="warm_start_secs"):
        hb.estimator.Estimator(model_fn, str(tmp_path / "d"), warm_start_secs=1)


def test_plain_estimator_inside_scope_is_refused_naming_it(tmp_path):
    """Regression: a plain tf.estimator.Estimator trained inside scope() wrote every worker's shards under the
    whole tables' names into the same files; it is refused when it builds its model, before writing anything,
    and works again outside the scope."""
    from collective import CollectiveStrategy

    def model_fn(features, labels, mode):
        weight = tf.compat.v1.get_variable("w", [1], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(features["x"] * weight - labels))
        step = tf.compat.v1.train.get_or_create_global_step()
        return tf.estimator.EstimatorSpec(mode, loss=loss,
                                          train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
                                              loss, global_step=step))

    def input_fn():
        return tf.data.Dataset.from_tensors(({"x": [[1.0]]}, [[2.0]])).repeat(2)

    estimator = tf.estimator.Estimator(model_fn, str(tmp_path / "plain"))
    with CollectiveStrategy("hb").scope():
        with pytest.raises(TypeError, match=r"plain tensorflow_estimator\..*\.EstimatorV2 cannot build its model "
                                            r"inside CollectiveStrategy.scope\(\).*strategy.estimator\(model_fn"):
            estimator.train(input_fn, max_steps=1)
    assert tf.train.latest_checkpoint(str(tmp_path / "plain")) is None
    estimator.train(input_fn, max_steps=1)
    assert tf.train.latest_checkpoint(str(tmp_path / "plain")).endswith("model.ckpt-1")


@launch_once
def canned_reference(base: pathlib.Path):
    """One-process references (plain TensorFlow Estimators) and the warm-start checkpoint: ``(reference, warm)``."""
    from workers import canned_cases

    reference = {}
    for name in canned_cases.NAMES:
        initial = canned_cases.write_initial_checkpoint(name, str(base / "initial" / name))
        plain = tf.estimator.Estimator(canned_cases.starting_from(canned_cases.canned(name, None), initial),
                                       str(base / "reference" / name))
        plain.train(canned_cases.train_input_fn(0, 1), max_steps=canned_cases.STEPS)
        metrics = plain.evaluate(canned_cases.eval_input_fn(0, 1))
        exported = plain.export_saved_model(str(base / "reference" / name / "export"),
                                            canned_cases.serving_input_receiver_fn)
        reference[name] = (plain.latest_checkpoint(), metrics, exported.decode())
    return reference, canned_cases.write_warm_checkpoint(str(base / "warm" / "model.ckpt"))


@launch_once
def canned_launch(base: pathlib.Path, n: int):
    """The canned estimators' launch on ``n`` workers (the 2-worker one runs beside the 1-worker estimator launch)."""
    _, warm = canned_reference(base)
    run_workers("canned_worker.py", n, [base / f"n{n}", base / "initial", warm], timeout=600)
    return load_rank_results(base / f"n{n}", n)


def canned_runs(base: pathlib.Path):
    """The one-process references, then the launches on 2 and 3 workers: ``(reference, {n: results}, base)``."""
    return canned_reference(base)[0], {n: canned_launch(base, n) for n in (2, 3)}, base


@pytest.fixture(scope="module")
def canned(base):
    return canned_runs(base / "canned")


@functools.lru_cache(maxsize=None)  # the references' exports are served for both worker counts
def _served(export_dir: str) -> np.ndarray:
    from workers import canned_cases

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        signature = tf.compat.v1.saved_model.load(sess, ["serve"], export_dir).signature_def["predict"]
        feed = {signature.inputs[k].name: v for k, v in canned_cases.PREDICT_FEED.items()}
        return sess.run(signature.outputs["logits"].name, feed)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", ["dnn", "linear", "combined"])
def test_canned_estimators_train_evaluate_and_export_as_one_process(canned, name, n):
    """DNNClassifier, LinearClassifier and DNNLinearCombinedClassifier through strategy.estimator(canned.model_fn)
    on N workers: the trained checkpoint and the served logits equal one plain TensorFlow process on the global
    batches."""
    (checkpoint, _, exported), results = canned[0][name], canned[1][n]
    want = tf.compat.v1.train.NewCheckpointReader(checkpoint)
    base = pathlib.Path(checkpoint).parents[2]
    got = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(str(base / f"n{n}" / name)))
    for key in want.get_variable_to_shape_map():
        np.testing.assert_allclose(got.get_tensor(key), want.get_tensor(key), rtol=1e-4, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(_served(str(results[0][f"{name}/export"])), _served(exported), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", ["dnn", "linear", "combined"])
def test_canned_estimators_evaluate_as_one_process(canned, name, n):
    """Every evaluation metric of the canned estimators, on every worker, equals one plain TensorFlow process's."""
    metrics, results = canned[0][name][1], canned[1][n]
    for r in range(n):
        assert f"{name}/eval_error" not in results[r], str(results[r][f"{name}/eval_error"])
        for key, value in metrics.items():
            np.testing.assert_allclose(results[r][f"{name}/eval/{key}"], value, rtol=1e-4, atol=1e-6,
                                       err_msg=f"{key} on rank {r}")


@pytest.mark.parametrize("n", [2, 3])
def test_canned_model_fn_inside_embedding_scope_is_refused_saying_how_to_use_it(canned, n):
    """Regression: a canned model_fn inside embedding_scope() made its dense kernels sharded tables and failed
    with "Dimensions must be equal"; it is refused at graph build."""
    for result in canned[1][n]:
        message = str(result["refusal"])
        assert "DNNClassifier" in message and "cannot run inside embedding_scope()" in message, message
        assert "strategy.estimator(canned.model_fn, model_dir)" in message, message


@pytest.mark.parametrize("n", [2, 3])
def test_warm_starts_load_a_sharded_tables_logical_rows(canned, n):
    """Regression: init_from_checkpoint (scope and one-to-one mappings), warm_start and an Estimator's
    warm_start_from into a sharded table failed with a shape error quoting the shard's shape (strategy.estimator
    took no warm_start_from); each worker now loads its rows of the stored table."""
    from workers import canned_cases

    for r, result in enumerate(canned[1][n]):
        for name, seed in canned_cases.WARM.items():
            np.testing.assert_array_equal(result[f"warm/{name}"], canned_cases.warm_values(seed)[r::n],
                                          err_msg=f"{name} on rank {r}")
        assert "cannot warm-start the sharded table 'wider' [6, 2] from 'ws/t1' of shape [5, 2]" in str(
            result["warm_refusal"]), str(result.get("warm_refusal"))
    # strategy.estimator(..., warm_start_from=WarmStartSettings(...)): trained at learning rate 0, the logical
    # checkpoint holds the warm-started table.
    trained = tf.train.latest_checkpoint(str(canned[2] / f"n{n}" / "warm_estimator"))
    np.testing.assert_array_equal(tf.compat.v1.train.load_variable(trained, "ws/t1"), canned_cases.warm_values(1))
