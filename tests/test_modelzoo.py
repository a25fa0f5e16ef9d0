"""The model zoo: each recipe trains on 1 and 2 workers with each backend, evaluates, exports a SavedModel
that plain TensorFlow serves (with tf.estimator's head signatures, from raw tensors or serialized tf.Example),
writes checkpoints and TensorBoard events to its model_dir on both engines, and matches the plain
single-process TensorFlow baseline; the estimator engine resumes a stopped run where it stopped."""

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launcher import run_together, run_workers

import collective.data
from collective.byte_model import sent_bytes
from modelzoo import heads
from modelzoo.repository import import_datasets

MODELS = ("dlrm", "deepfm", "movielens")
pytestmark = pytest.mark.timeout(1800)  # 12 small trainings in 2 launches: minutes, longer on a loaded machine
ROW_GROUP = 16  # = the per-worker batch on 2 workers: N workers then read exactly the rows one process reads
# At world size 1 both backends look up with one local gather; sok is run on 2 workers, where it differs.
RUNS = [("plain", 1), ("hb", 1), ("hb", 2), ("sok", 2)]
EXPORTED = [("hb", 1), ("sok", 2)]  # raw feature inputs; serialized tf.Example (and raw again from its checkpoint)
SCORE = {"dlrm": "logistic", "deepfm": "logistic", "movielens": "predictions"}  # the head's [B, 1] score


def _write_criteo(root):
    ds = import_datasets()
    for part, rows, seed in (("train", 512, 0), ("test", 128, 1)):
        ds.synthetic.generate(str(root / part), rows, scale=0.0001, seed=seed, row_group_size=ROW_GROUP)
    (root / "meta.json").write_text(json.dumps({"scale": 0.0001,
                                                "cardinalities": list(ds.synthetic.cardinalities(0.0001))}))


def _write_movielens(root, users=40, items=60, genres=5):
    rng = np.random.default_rng(0)
    bias_u, bias_i = rng.normal(0, 0.5, users), rng.normal(0, 0.5, items)
    item_genres = [sorted(set(rng.integers(0, genres, rng.integers(0, 3)).tolist())) for _ in range(items)]
    for part, rows in (("train", 512), ("test", 128)):
        u, i = rng.integers(0, users, rows), rng.integers(0, items, rows)
        rating = np.clip(np.round(2 * (3.5 + bias_u[u] + bias_i[i] + rng.normal(0, 0.5, rows))) / 2, 0.5, 5)
        table = pa.table({"user_id": u, "item_id": i, "rating": rating.astype(np.float32),
                          "label": (rating >= 4).astype(np.float32),
                          "genres": pa.array([item_genres[k] for k in i], pa.list_(pa.int64()))})
        pq.write_table(table, root / f"{part}.parquet", row_group_size=ROW_GROUP)
    (root / "meta.json").write_text(json.dumps({"users": users, "items": items, "train_rows": 512, "test_rows": 128,
                                                "format": "test", "vocabularies": {"genres": list("abcde")}}))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Every model trained by every (backend, workers) of RUNS: {(model, backend, n): (metrics, predictions)}."""
    root = tmp_path_factory.mktemp("zoo")
    criteo, ml, out = root / "criteo", root / "movielens", root / "out"
    for d in (criteo, ml, out):
        d.mkdir()
    _write_criteo(criteo)
    _write_movielens(ml)
    launches = run_together([
        lambda: run_workers("modelzoo_worker.py", 1, [out, criteo, ml, "plain", "hb+export"], timeout=1500),
        lambda: run_workers("modelzoo_worker.py", 2, [out, criteo, ml, "hb", "sok+export+example",
                                                      "sok+estimator+resume+export"], timeout=1500)])
    for ok, value in launches:
        if not ok:
            raise value
    results = {}
    for model in MODELS:
        for backend, n in RUNS:
            stem = out / f"{model}-{backend}-n{n}"
            with np.load(f"{stem}.npz") as data:
                predictions = {k: data[k] for k in data.files}
            results[model, backend, n] = json.loads(open(f"{stem}.json").read()), predictions
    return {"results": results, "criteo": criteo, "movielens": ml, "out": out}


def _global_order(files, n):
    """Row indices (in file order) of the rows N workers evaluate, in the order their predictions are gathered."""
    starts, offset = {}, 0
    for piece in collective.data.shard_of(files, rank=0, world_size=1):
        starts[piece.path, piece.row_group] = offset
        offset += piece.num_rows
    order = []
    for r in range(n):
        for piece in collective.data.shard_of(files, rank=r, world_size=n):
            first = starts[piece.path, piece.row_group] + piece.first_row
            order.extend(range(first, first + piece.num_rows))
    return np.array(order)


def _test_files(zoo, model):
    return collective.data.expand_filenames(str(zoo["movielens"] / "test.parquet") if model == "movielens"
                                            else str(zoo["criteo"] / "test"))


@pytest.mark.parametrize("model", MODELS)
def test_every_backend_and_worker_count_trains_what_plain_tensorflow_trains(zoo, model):
    base_metrics, base = zoo["results"][model, "plain", 1]
    assert base_metrics["eval_rows"] == 128
    key = SCORE[model]
    for backend, n in RUNS[1:]:
        metrics, predictions = zoo["results"][model, backend, n]
        inverse = np.argsort(_global_order(_test_files(zoo, model), n))
        np.testing.assert_allclose(predictions[key][inverse], base[key], rtol=2e-4, atol=2e-5,
                                   err_msg=f"{model} {backend} on {n} worker(s)")
        for name in ("loss", "auc", "rmse", "train_loss"):
            if name in base_metrics and (name != "train_loss" or n == 1):  # rank 0's own half-batch on 2
                assert metrics[name] == pytest.approx(base_metrics[name], rel=1e-4, abs=1e-5), (model, backend, n, name)
        assert metrics["workers"] == n and metrics["steps"] == 8 and metrics["samples_per_sec"] > 0
        if n > 1:
            assert metrics["bytes_per_sample"] > 0, "two workers exchange ids and vectors"
    # Training moved the model: the baseline's predictions are not all the initial ones.
    assert np.std(base[key]) > 1e-4


def test_bytes_per_sample_is_one_number_on_both_engines(zoo):
    """collective.byte_model.bytes_per_sample: all workers' bytes over the global samples, whether the session
    engine counts it or ThroughputHook does under --engine estimator (same data and batches). sok's bytes per
    step do not depend on the ids, so the resumed estimator command's steps 5-8 send what the session engine's
    steps 1-8 send per sample."""
    session = json.loads((zoo["out"] / "dlrm-sok-n2.json").read_text())
    estimator = json.loads((zoo["out"] / "dlrm-sok-est-resume-n2.json").read_text())
    # Beside the model's exchanges, the Estimator's step allreduces its input-sync counts (2 int64) and
    # [loss, has_data] (2 float32); the session engine's logged loss is left out.
    extra = 2 * (sent_bytes("allreduce", 16, 2) + sent_bytes("allreduce", 8, 2)) / 32
    # The Estimator's checkpoint hook also allreduces a [2] int32 flag (save due, preempted) after each step,
    # 16 B per step over both workers: counted for the steps inside ThroughputHook's window.
    flag = 2 * sent_bytes("allreduce", 8, 2) / 32
    assert session["bytes_per_sample"] > 0
    assert 0 <= estimator["bytes_per_sample"] - (session["bytes_per_sample"] + extra) <= flag + 1e-9
    # Checkpoint saves move whole tables; they are not training traffic and used to add about 450 B/sample.


@pytest.mark.parametrize("model", MODELS)
def test_metrics_are_the_head_metrics_of_the_gathered_predictions(zoo, model):
    metrics, predictions = zoo["results"][model, "sok", 2]
    if model == "movielens":
        err = predictions["predictions"] - predictions["rating"]
        assert metrics["rmse"] == pytest.approx(float(np.sqrt(np.mean(err.astype(np.float64) ** 2))), rel=1e-6)
        assert 0.5 <= predictions["predictions"].min() and predictions["predictions"].max() <= 5.0
    else:
        assert metrics["auc"] == pytest.approx(heads.exact_auc(predictions["label"], predictions["logistic"]))
        np.testing.assert_allclose(predictions["logistic"], 1 / (1 + np.exp(-predictions["logits"])), rtol=1e-5)
        np.testing.assert_array_equal(predictions["class_ids"], predictions["logits"] > 0)
    with open(os.path.join(os.path.dirname(metrics["export_path"]), "..", "metrics.json")) as f:
        assert json.load(f)["loss"] == metrics["loss"]


def _scalars(directory):
    """{tag: {step: value}} of the event files directly in ``directory``, and how many files there are."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
    scalars = {}
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                steps = scalars.setdefault(value.tag, {})
                assert event.step not in steps, f"{value.tag} of step {event.step} written twice (by two ranks?)"
                steps[event.step] = value.simple_value
    return scalars, len(files)


@pytest.mark.parametrize("model,engine", [("dlrm", "session"), ("movielens", "session"), ("dlrm", "estimator")])
def test_model_dir_holds_checkpoints_and_events(zoo, model, engine):
    """2 workers, 8 steps, checkpoints and events every 4: logical tables in the checkpoints, loss and
    samples/s events, and the evaluation metrics of metrics.json in model_dir/eval. The estimator's model_dir
    is the resumed run's (4 steps, then the same command with --steps 8): an evaluation at the end of
    each command."""
    import tensorflow as tf

    model_dir = str(zoo["out"] / f"{model}-sok-{'' if engine == 'session' else 'est-resume-'}n2")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["workers"] == 2 and metrics["steps"] == 8
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest == os.path.join(model_dir, "model.ckpt-8"), latest
    assert tf.compat.v1.train.checkpoint_exists(os.path.join(model_dir, "model.ckpt-4"))
    shapes = tf.train.load_checkpoint(model_dir).get_variable_to_shape_map()
    assert shapes["global_step"] == []
    assert int(tf.train.load_checkpoint(model_dir).get_tensor("global_step")) == 8
    if model == "dlrm":
        meta = json.loads((zoo["criteo"] / "meta.json").read_text())
        tables = {f"embedding/C{i + 1}": [size, 4] for i, size in enumerate(meta["cardinalities"])}
    else:
        tables = {"factors/user_id": [40, 4], "factors/item_id": [60, 4], "biases/user_id": [40, 1],
                  "biases/item_id": [60, 1]}
    for name, shape in tables.items():  # whole logical tables, whatever the world size
        assert shapes.get(name) == shape, (name, shapes.get(name), sorted(shapes))

    train, files = _scalars(model_dir)
    assert files == 1, "rank 0 alone writes events"
    # Estimator's own loss summaries: the first step, then every 4 from there.
    assert set(train["loss"]) == ({1, 4, 8} if engine == "session" else {1, 5}), train["loss"]
    assert set(train["samples/s"]) == {4, 8} and min(train["samples/s"].values()) > 0, train["samples/s"]
    if engine == "session":
        assert train["loss"][8] == pytest.approx(metrics["train_loss"], rel=1e-6)
    evaluation, files = _scalars(os.path.join(model_dir, "eval"))
    assert files == 1
    for name in ("loss", "auc", "rmse"):
        if name in metrics:
            assert set(evaluation[name]) == ({8} if engine == "session" else {4, 8}), name
            assert evaluation[name][8] == pytest.approx(metrics[name], rel=1e-6), name
    assert ("rmse" if model == "movielens" else "auc") in evaluation


def _checkpoint_values(path):
    """{name: value} of every variable in the checkpoint (or SavedModel variables) at ``path``."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def test_estimator_engine_resumes_where_it_stopped(zoo):
    """--engine estimator run for 4 steps, then the same command with --steps 8 in its model_dir: training
    goes on from global step 4 with the input where it stopped (regression: it read the first batches
    again) and ends with the weights, optimizer slots, metrics and step losses of one uninterrupted 8-step
    run, the session engine's (both engines train the same weights from the same batches); the resumed run
    evaluates and exports its step-8 weights."""
    out = zoo["out"]
    resumed_dir, whole_dir = out / "dlrm-sok-est-resume-n2", out / "dlrm-sok-n2"
    first = json.loads((out / "dlrm-sok-est-resume-n2-first.json").read_text())
    resumed = json.loads((out / "dlrm-sok-est-resume-n2.json").read_text())
    whole = json.loads((whole_dir / "metrics.json").read_text())
    assert first["steps"] == 4 and resumed["steps"] == 8
    assert json.loads((resumed_dir / "metrics.json").read_text()) == resumed

    at4, at8 = _checkpoint_values(resumed_dir / "model.ckpt-4"), _checkpoint_values(resumed_dir / "model.ckpt-8")
    reference = _checkpoint_values(whole_dir / "model.ckpt-8")
    assert int(at4["global_step"]) == 4 and int(at8["global_step"]) == 8
    assert sorted(at8) == sorted(reference)
    meta = json.loads((zoo["criteo"] / "meta.json").read_text())
    for i, size in enumerate(meta["cardinalities"]):  # whole logical tables and their Adagrad accumulators
        assert at8[f"embedding/C{i + 1}"].shape == at8[f"embedding/C{i + 1}/Adagrad"].shape == (size, 4)
    assert any(name.startswith("top_mlp/") for name in at8) and any(name.startswith("bottom_mlp/") for name in at8)
    for name, want in reference.items():
        np.testing.assert_allclose(at8[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.allclose(at4["top_mlp/dense_0/kernel"], at8["top_mlp/dense_0/kernel"]), "steps 5-8 trained"

    for name in ("auc", "loss", "train_loss"):
        assert resumed[name] == pytest.approx(whole[name], rel=1e-6, abs=1e-7), name
    train, _ = _scalars(str(resumed_dir))  # a restart at step 0 would write the loss of step 1 twice
    whole_losses = dict(zip(whole["loss_curve"]["steps"], whole["loss_curve"]["losses"]))
    assert set(train["loss"]) == {1, 5}
    assert train["loss"] == pytest.approx({step: whole_losses[step] for step in (1, 5)}, rel=1e-6)
    evaluation, _ = _scalars(str(resumed_dir / "eval"))
    assert set(evaluation["auc"]) == {4, 8}, evaluation["auc"]
    assert evaluation["auc"][4] == pytest.approx(first["auc"], rel=1e-6)
    assert evaluation["auc"][8] == pytest.approx(resumed["auc"], rel=1e-6)

    assert first["export_path"] != resumed["export_path"]
    assert os.path.dirname(resumed["export_path"]) == str(resumed_dir / "export")
    exported = _checkpoint_values(os.path.join(resumed["export_path"], "variables", "variables"))
    assert int(exported["global_step"]) == 8 and "embedding/C1" in exported
    for name, value in exported.items():
        np.testing.assert_array_equal(value, at8[name], err_msg=name)


def test_exact_auc_against_pairs():
    rng = np.random.default_rng(0)
    labels, scores = rng.random(200) < 0.3, np.round(rng.random(200), 1)  # many ties
    pos, neg = scores[labels], scores[~labels]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert heads.exact_auc(labels, scores) == pytest.approx(pairs)


_SERVE = textwrap.dedent("""
    import json, sys
    import numpy as np, pyarrow.parquet as pq, tensorflow as tf

    def spec(t):
        return [t.dtype.name, t.shape.as_list()]

    def raw_inputs(signature, table, n):
        inputs = {}
        for name, ts in signature.structured_input_signature[1].items():
            column = table.column(name)
            if ts.shape.rank == 2:  # multi-hot genres
                hot = np.zeros((n, ts.shape[1]), np.float32)
                for row, ids in enumerate(column.to_pylist()):
                    hot[row, ids] = 1.0
                inputs[name] = tf.constant(hot)
            else:
                inputs[name] = tf.constant(column.to_numpy().astype(ts.dtype.as_numpy_dtype))
        return inputs

    def examples(table, raw_signature):
        # One tf.Example per row, as a TF Serving client builds it: floats, ids, the genre id list.
        specs = raw_signature.structured_input_signature[1]
        out = []
        for row in table.select(list(specs)).to_pylist():
            feature = {}
            for name, value in row.items():
                if specs[name].dtype == tf.float32 and specs[name].shape.rank == 1:
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
                else:
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
                        value=value if isinstance(value, list) else [value]))
            out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return tf.constant(out)

    def value(t):
        t = t.numpy()
        return t.astype(str).tolist() if t.dtype == object else t.tolist()

    out = {}
    for path, raw_path, data, n in json.loads(sys.argv[1]):
        table = pq.read_table(data).slice(0, n)
        signatures = tf.saved_model.load(path).signatures
        raw = tf.saved_model.load(raw_path).signatures["predict"] if raw_path else signatures["predict"]
        result = {}
        for key, signature in signatures.items():
            inputs = signature.structured_input_signature[1]
            if all(t.dtype == tf.string for t in inputs.values()):
                feed = {name: examples(table, raw) for name in inputs}
            else:
                feed = raw_inputs(signature, table, n)
            result[key] = {"inputs": {k: spec(t) for k, t in inputs.items()},
                           "outputs": {k: spec(t) for k, t in signature.structured_outputs.items()},
                           "values": {k: value(t) for k, t in signature(**feed).items()}}
        out[path] = result
    assert not any(m.split(".")[0] in ("collective", "horovod", "modelzoo") for m in sys.modules), "not plain TF"
    # `saved_model_cli show --dir DIR --all`, the console script's own entry point, in this interpreter.
    import contextlib, io
    from tensorflow.python.tools import saved_model_cli
    text = io.StringIO()
    sys.argv = ["saved_model_cli", "show", "--dir", sys.argv[2], "--all"]
    with contextlib.redirect_stdout(text):
        try:
            saved_model_cli.main()
        except SystemExit as exit:
            assert not exit.code, f"saved_model_cli exited {exit.code}"
    print(json.dumps({"served": out, "saved_model_cli": text.getvalue()}))
""")

BINARY_PREDICT = {"logits": ["float32", [None, 1]], "logistic": ["float32", [None, 1]],
                  "probabilities": ["float32", [None, 2]], "class_ids": ["int64", [None, 1]],
                  "classes": ["string", [None, 1]], "all_class_ids": ["int32", [None, 2]],
                  "all_classes": ["string", [None, 2]]}  # tf.estimator.BinaryClassHead's
EXAMPLES = {"examples": ["string", [None]]}  # build_parsing_serving_input_receiver_fn's
CLASSIFY_REGRESS_INPUTS = {"inputs": ["string", [None]]}


@pytest.fixture(scope="module")
def serving(zoo):
    """One plain-TensorFlow process: every export served on the first test row group, and what
    ``saved_model_cli show --all`` prints for DLRM's sok export (serialized tf.Example inputs)."""
    jobs = []
    for model in MODELS:
        for backend, n in EXPORTED:
            metrics, _ = zoo["results"][model, backend, n]
            first = _test_files(zoo, model)[0]
            rows = pq.ParquetFile(first).metadata.row_group(0).num_rows  # row group 0 is evaluated first
            jobs.append([metrics["export_path"], metrics.get("export_raw_path"), first, rows])
            if metrics.get("export_raw_path"):
                jobs.append([metrics["export_raw_path"], None, first, rows])
    cli_export = zoo["results"]["dlrm", "sok", 2][0]["export_path"]
    proc = subprocess.run([sys.executable, "-c", _SERVE, json.dumps(jobs), cli_export], capture_output=True,
                          text=True, timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def served(serving):
    """{export path: {signature: {"inputs", "outputs", "values"}}} of every export, served by plain TensorFlow."""
    return serving["served"]


def test_exported_saved_models_serve_in_plain_tensorflow(zoo, served):
    """Raw-tensor and tf.Example exports give the distributed model's evaluation predictions."""
    for model in MODELS:
        key = SCORE[model]
        for backend, n in EXPORTED:
            metrics, predictions = zoo["results"][model, backend, n]
            for path in (metrics["export_path"], metrics.get("export_raw_path")):
                if path:
                    got = np.asarray(served[path]["predict"]["values"][key])
                    assert got.shape[1:] == (1,), (path, got.shape)
                    np.testing.assert_allclose(got[:, 0], predictions[key][:len(got)], rtol=1e-5, atol=1e-6,
                                               err_msg=path)


@pytest.mark.parametrize("model", MODELS)
def test_exported_signatures_are_the_estimator_heads(zoo, served, model):
    """tf.estimator's head conventions: signature names, output keys, shapes, dtypes and values; the
    serialized tf.Example signatures give what the raw-tensor signature gives for the same rows."""
    binary = model != "movielens"
    predict_outputs = BINARY_PREDICT if binary else {"predictions": ["float32", [None, 1]]}
    raw_exports = [zoo["results"][model, "hb", 1][0]["export_path"], zoo["results"][model, "sok", 2][0]["export_raw_path"]]
    for path in raw_exports:  # Estimator writes predict alone for raw inputs; we name it serving_default too
        signatures = served[path]
        assert set(signatures) == {"predict", "serving_default"}, path
        assert signatures["serving_default"] == signatures["predict"]
        assert signatures["predict"]["outputs"] == predict_outputs
    example = served[zoo["results"][model, "sok", 2][0]["export_path"]]
    raw = served[raw_exports[1]]["predict"]["values"]
    assert set(example) == ({"serving_default", "classification", "regression", "predict"} if binary
                            else {"serving_default", "regression", "predict"})
    assert example["predict"]["inputs"] == EXAMPLES and example["predict"]["outputs"] == predict_outputs
    values = example["predict"]["values"]
    for key, want in raw.items():  # the same checkpoint, the same rows: raw tensors or tf.Example
        if predict_outputs[key][0] == "string":
            assert values[key] == want, key
        else:
            np.testing.assert_allclose(values[key], want, rtol=1e-6, atol=1e-7, err_msg=key)
    if not binary:
        for key in ("serving_default", "regression"):
            assert example[key]["inputs"] == CLASSIFY_REGRESS_INPUTS
            assert example[key]["outputs"] == {"outputs": ["float32", [None, 1]]}
            np.testing.assert_allclose(example[key]["values"]["outputs"], values["predictions"], rtol=1e-6)
        return
    logits, logistic = np.asarray(values["logits"]), np.asarray(values["logistic"])
    probabilities = np.asarray(values["probabilities"])
    np.testing.assert_allclose(logistic, 1 / (1 + np.exp(-logits)), rtol=1e-5)
    np.testing.assert_allclose(probabilities[:, 1:], logistic, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(values["class_ids"], (logits > 0).astype(int))
    assert values["classes"] == [[str(int(c))] for c in np.asarray(values["class_ids"])[:, 0]]
    assert values["all_class_ids"] == [[0, 1]] * len(logits) and values["all_classes"] == [["0", "1"]] * len(logits)
    for key in ("serving_default", "classification"):
        assert example[key]["inputs"] == CLASSIFY_REGRESS_INPUTS
        assert example[key]["outputs"] == {"classes": ["string", [None, 2]], "scores": ["float32", [None, 2]]}
        np.testing.assert_allclose(example[key]["values"]["scores"], probabilities, rtol=1e-6)
        assert example[key]["values"]["classes"] == values["all_classes"]
    assert example["regression"]["inputs"] == CLASSIFY_REGRESS_INPUTS
    assert example["regression"]["outputs"] == {"outputs": ["float32", [None, 1]]}
    np.testing.assert_allclose(example["regression"]["values"]["outputs"], logistic, rtol=1e-6)


def test_saved_model_cli_shows_the_estimator_signatures(serving):
    """``saved_model_cli show --all`` (its console script's entry point, run in the serving fixture's plain
    TensorFlow process) on DLRM's tf.Example export."""
    text = serving["saved_model_cli"]
    for name in ("serving_default", "classification", "regression", "predict"):
        assert f"signature_def['{name}']:" in text, text
    for output, dtype, shape in (("probabilities", "DT_FLOAT", "(-1, 2)"), ("logistic", "DT_FLOAT", "(-1, 1)"),
                                 ("classes", "DT_STRING", "(-1, 1)"), ("class_ids", "DT_INT64", "(-1, 1)")):
        assert re.search(rf"outputs\['{output}'\] tensor_info:\s+dtype: {dtype}\s+shape: {re.escape(shape)}", text), output
    assert re.search(r"inputs\['examples'\] tensor_info:\s+dtype: DT_STRING\s+shape: \(-1\)", text), text


@pytest.mark.parametrize("module", ["modelzoo.dlrm.model", "modelzoo.deepfm.model", "modelzoo.movielens.model"])
def test_train_help_shows_each_default_once_in_plain_text(module, capsys):
    """Regression: "(default from COLLECTIVE_STRATEGY, else hb) (default: hb)" and ``model_fn`` markup."""
    import importlib

    from modelzoo import flags

    recipe = importlib.import_module(module).RECIPE
    p = flags.parser(f"{recipe.name}/train.py", recipe.description, recipe.defaults)
    recipe.add_flags(p)
    text = p.format_help()
    assert "``" not in text
    for flag in re.findall(r"^  (--[a-z_]+)", text, flags=re.M):
        block = text.split(f"  {flag}", 1)[1].split("\n  --", 1)[0]
        assert block.count("default") <= 1, f"{flag}: {block}"
