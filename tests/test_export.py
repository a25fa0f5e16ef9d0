"""SavedModel export: rank 0 writes whole tables; plain TensorFlow serves them without collective or Horovod.

One launch on 2 workers trains, predicts with the sharded model and exports
through ``strategy.export_saved_model`` and ``export_estimator`` for both
backends; the SavedModels are then served in a subprocess where importing
``collective`` or ``horovod`` fails, and with ``saved_model_cli``.
"""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from launcher import WORKERS, load_rank_results, run_workers
from workers import checkpoint_cases as cc

N = 2
# Several launches share one module fixture: on a loaded 2-core machine they outlast the default timeout.
pytestmark = pytest.mark.timeout(2400)
BACKENDS = ("hb", "sok")
CLI = pathlib.Path(sys.executable).with_name("saved_model_cli")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    run_workers("export_worker.py", N, [base], timeout=500)
    inputs = base / "inputs.npz"
    np.savez(inputs, **cc.serving_inputs())
    return base, inputs, {b: load_rank_results(base / b, N) for b in BACKENDS + ("sok-hash",)}


def _serve(export_dir, inputs, out):
    proc = subprocess.run([sys.executable, str(WORKERS / "export_serve.py"), export_dir, inputs, out],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ["exported", "exported_estimator"])
def test_export_serves_the_distributed_predictions_without_collective(exported, tmp_path, backend, entry):
    base, inputs, results = exported
    assert results[backend][0]["placements"].tolist() == [{"hb": "row_wise", "sok": "column_wise"}[backend]] * 2
    export_dir = str(results[backend][0][entry])
    assert export_dir.startswith(str(base / backend)), export_dir
    assert str(results[backend][1][entry]) == ""  # rank 1 returned None
    distributed = np.concatenate([results[backend][r]["logits"] for r in range(N)])
    served = _serve(export_dir, inputs, tmp_path / "served.npz")["logits"]
    np.testing.assert_allclose(served, distributed, rtol=1e-5, atol=1e-6)
    # Not a model that ignores its inputs: the rows differ.
    assert np.ptp(served) > 1e-3


def test_saved_model_cli_shows_and_runs_the_export(exported, tmp_path):
    base, _, results = exported
    export_dir = str(results["hb"][0]["exported"])
    show = subprocess.run([str(CLI), "show", "--dir", export_dir, "--all"], capture_output=True, text=True,
                          timeout=300)
    assert show.returncode == 0, show.stderr[-4000:]
    for text in ("serving_default", "inputs['ids']", "inputs['sp']", "inputs['weights']", "outputs['logits']"):
        assert text in show.stdout, show.stdout
    data = cc.serving_inputs()
    exprs = ";".join(f"{k}={v.tolist()}" for k, v in data.items())  # literals only: the CLI parses them safely
    run = subprocess.run([str(CLI), "run", "--dir", export_dir, "--tag_set", "serve", "--signature_def",
                          "serving_default", "--input_exprs", exprs, "--outdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    distributed = np.concatenate([results["hb"][r]["logits"] for r in range(N)])
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), distributed, rtol=1e-5, atol=1e-6)


def test_hash_table_export_serves_the_distributed_predictions(exported, tmp_path):
    """Keys -> rows through a tf.lookup table filled from the checkpoint; unseen keys read zeros on both sides."""
    _, _, results = exported
    res = results["sok-hash"]
    inputs = tmp_path / "keys.npz"
    np.savez(inputs, keys=res[0]["keys"])
    served = _serve(str(res[0]["exported"]), inputs, tmp_path / "served.npz")["prediction"]
    distributed = np.concatenate([res[r]["prediction"] for r in range(N)])
    np.testing.assert_allclose(served, distributed, rtol=1e-5, atol=1e-6)
    assert np.ptp(served) > 1e-3


def test_export_reports_the_export_phase_to_the_launcher(tmp_path, monkeypatch):
    """Regression: an export wrote no heartbeat, and one longer than the stall timeout was a stall. A program that
    sent no heartbeat before the export sends none after it (the launcher has nothing to judge it by)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective.runtime import heartbeat  # pylint: disable=import-outside-toplevel
    from collective.integration.export import export_saved_model  # pylint: disable=import-outside-toplevel
    from collective.runtime.stall import ENV, read_beat  # pylint: disable=import-outside-toplevel

    path = str(tmp_path / "heartbeat")
    monkeypatch.setenv(ENV, path)
    monkeypatch.setattr(heartbeat, "_state", {"steps": 0, "phase": None})

    def model(x):
        return tf.matmul(x, tf.compat.v1.get_variable("w", [2, 1], initializer=tf.compat.v1.ones_initializer()))

    with tf.Graph().as_default():
        model(tf.zeros([1, 2]))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
    seen = []

    def signature_def():
        seen.append(read_beat(path))
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        return tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": model(x)})

    assert export_saved_model(str(tmp_path / "export"), prefix, signature_def)
    assert seen[0] is not None and seen[0].phase == "export"
    assert read_beat(path) is None
