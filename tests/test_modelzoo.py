"""The model zoo: each recipe trains on 1 and 2 workers with each backend, evaluates, exports a SavedModel
that plain TensorFlow serves, and matches the plain single-process TensorFlow baseline."""

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

from launcher import run_workers

import collective.data
from modelzoo import heads
from modelzoo.features import import_datasets

MODELS = ("dlrm", "deepfm", "movielens")
pytestmark = pytest.mark.timeout(1800)  # 12 small trainings in 2 launches: minutes, longer on a loaded machine
ROW_GROUP = 16  # = the per-worker batch on 2 workers: N workers then read exactly the rows one process reads
# At world size 1 both backends look up with one local gather; sok is run on 2 workers, where it differs.
RUNS = [("plain", 1), ("hb", 1), ("hb", 2), ("sok", 2)]
EXPORTED = [("hb", 1), ("sok", 2)]


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
    run_workers("modelzoo_worker.py", 1, [out, criteo, ml, "plain", "hb+export"], timeout=1500)
    run_workers("modelzoo_worker.py", 2, [out, criteo, ml, "hb", "sok+export"], timeout=1500)
    results = {}
    for model in MODELS:
        for backend, n in RUNS:
            stem = out / f"{model}-{backend}-n{n}"
            with np.load(f"{stem}.npz") as data:
                predictions = {k: data[k] for k in data.files}
            results[model, backend, n] = json.loads(open(f"{stem}.json").read()), predictions
    return {"results": results, "criteo": criteo, "movielens": ml}


def _global_order(files, n):
    """Row indices (in file order) of the rows N workers evaluate, in the order their predictions are gathered."""
    starts, offset = {}, 0
    for path, rg in collective.data.shard_of(files, rank=0, world_size=1):
        starts[path, rg] = offset
        offset += pq.ParquetFile(path).metadata.row_group(rg).num_rows
    order = []
    for r in range(n):
        for path, rg in collective.data.shard_of(files, rank=r, world_size=n):
            rows = pq.ParquetFile(path).metadata.row_group(rg).num_rows
            order.extend(range(starts[path, rg], starts[path, rg] + rows))
    return np.array(order)


def _test_files(zoo, model):
    return collective.data.expand_filenames(str(zoo["movielens"] / "test.parquet") if model == "movielens"
                                            else str(zoo["criteo"] / "test"))


@pytest.mark.parametrize("model", MODELS)
def test_every_backend_and_worker_count_trains_what_plain_tensorflow_trains(zoo, model):
    base_metrics, base = zoo["results"][model, "plain", 1]
    assert base_metrics["eval_rows"] == 128
    key = "probabilities" if model != "movielens" else "prediction"
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


@pytest.mark.parametrize("model", MODELS)
def test_metrics_are_the_head_metrics_of_the_gathered_predictions(zoo, model):
    metrics, predictions = zoo["results"][model, "sok", 2]
    if model == "movielens":
        err = predictions["prediction"] - predictions["rating"]
        assert metrics["rmse"] == pytest.approx(float(np.sqrt(np.mean(err.astype(np.float64) ** 2))), rel=1e-6)
        assert 0.5 <= predictions["prediction"].min() and predictions["prediction"].max() <= 5.0
    else:
        assert metrics["auc"] == pytest.approx(heads.exact_auc(predictions["label"], predictions["probabilities"]))
    with open(os.path.join(os.path.dirname(metrics["export_path"]), "..", "metrics.json")) as f:
        assert json.load(f)["loss"] == metrics["loss"]


def test_exact_auc_against_pairs():
    rng = np.random.default_rng(0)
    labels, scores = rng.random(200) < 0.3, np.round(rng.random(200), 1)  # many ties
    pos, neg = scores[labels], scores[~labels]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert heads.exact_auc(labels, scores) == pytest.approx(pairs)


_SERVE = textwrap.dedent("""
    import json, sys
    import numpy as np, pyarrow.parquet as pq, tensorflow as tf
    out = {}
    for path, data, n in json.loads(sys.argv[1]):
        table = pq.read_table(data).slice(0, n)
        serve = tf.saved_model.load(path).signatures["serving_default"]
        inputs = {}
        for name, spec in serve.structured_input_signature[1].items():
            column = table.column(name)
            if spec.shape.rank == 2:  # multi-hot genres
                hot = np.zeros((n, spec.shape[1]), np.float32)
                for row, ids in enumerate(column.to_pylist()):
                    hot[row, ids] = 1.0
                inputs[name] = tf.constant(hot)
            else:
                inputs[name] = tf.constant(column.to_numpy().astype(spec.dtype.as_numpy_dtype))
        out[path] = {k: v.numpy().tolist() for k, v in serve(**inputs).items()}
    assert not any(m.split(".")[0] in ("collective", "horovod", "modelzoo") for m in sys.modules), "not plain TF"
    print(json.dumps(out))
""")


def test_exported_saved_models_serve_in_plain_tensorflow(zoo):
    jobs, expected = [], {}
    for model in MODELS:
        for backend, n in EXPORTED:
            metrics, predictions = zoo["results"][model, backend, n]
            first = _test_files(zoo, model)[0]
            rows = pq.ParquetFile(first).metadata.row_group(0).num_rows  # row group 0 is evaluated first
            key = "probabilities" if model != "movielens" else "prediction"
            jobs.append([metrics["export_path"], first, rows])
            expected[metrics["export_path"]] = (key, predictions[key][:rows])
    proc = subprocess.run([sys.executable, "-c", _SERVE, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    for path, (key, want) in expected.items():
        np.testing.assert_allclose(served[path][key], want, rtol=1e-5, atol=1e-6, err_msg=path)


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
