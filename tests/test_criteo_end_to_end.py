"""The chain a user with Criteo files runs: convert a Kaggle-format TSV with our converter, train DLRM on 2
workers from it (``--data``, table sizes from the converter's meta.json), export, and serve the SavedModel
with plain TensorFlow in a process that imports neither collective nor Horovod (their ops would not load)."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from datasets import schema
from launcher import run_workers

ROWS, DIM = 3000, 4
# 15 steps of a tiny DLRM learn C1 from embeddings started at dim ** -0.5, not at the zoo's small default.
MODEL_FLAGS = ["--batch_size", 128, "--embedding_dim", DIM, "--bottom_mlp", "8,4", "--top_mlp", "8,1",
               "--learning_rate", "0.1", "--embedding_stddev", DIM ** -0.5]
pytestmark = pytest.mark.timeout(900)

def write_kaggle_tsv(path, rows, seed=0):
    """Criteo Kaggle's format (label, 13 counts, 26 hex values; blanks for missing); the label follows C1 and I1."""
    rng = np.random.default_rng(seed)
    values = [rng.integers(0, 2 ** 32, 40 + 30 * c) for c in range(26)]   # each column's distinct values
    weight = rng.normal(0, 2, len(values[0]))
    lines = []
    for _ in range(rows):
        picks = [int(rng.zipf(1.3) - 1) % len(v) for v in values]
        ints = rng.poisson(3, 13)
        logit = weight[picks[0]] + 0.4 * (ints[0] - 3)
        label = int(rng.random() < 1 / (1 + np.exp(-logit)))
        cats = [format(int(v[p]), "08x") if rng.random() > 0.05 else "" for v, p in zip(values, picks)]
        counts = [str(int(i)) if rng.random() > 0.1 else "" for i in ints]
        lines.append("\t".join([str(label)] + counts + cats))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, repo_root):
    root = tmp_path_factory.mktemp("criteo-e2e")
    src = write_kaggle_tsv(root / "train.txt", ROWS)
    data = root / "data"
    proc = subprocess.run([sys.executable, "-m", "datasets.criteo", src, "--out", str(data), "--min_count", "2",
                           "--test_fraction", "0.2", "--row_group_size", "128", "--quiet"], cwd=repo_root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    model_dir = root / "model"
    run_workers(str(repo_root / "modelzoo" / "dlrm" / "train.py"), 2,
                ["--data", data, "--model_dir", model_dir] + MODEL_FLAGS + ["--steps", 15, "--log_every", 0],
                timeout=600)
    metrics = json.loads((model_dir / "metrics.json").read_text())
    return data, model_dir, metrics


def test_the_model_has_the_converters_table_sizes(trained):
    import tensorflow as tf

    data, model_dir, _ = trained
    cardinalities = schema.read_meta(str(data))["cardinalities"]
    assert max(cardinalities) > 30, "the tables must be larger than a small default would make them"
    shapes = tf.train.load_checkpoint(str(model_dir)).get_variable_to_shape_map()
    assert [shapes[f"embedding/{c}"] for c in schema.CATEGORICAL] == [[size, DIM] for size in cardinalities]


def test_plain_tensorflow_serves_what_the_workers_evaluated(trained, served):
    """The converted-id export served on the test split (the first rows the serving process fed it)."""
    from modelzoo.heads import exact_auc

    data, _, metrics = trained
    label = pq.read_table(str(data / "test")).column("label").to_numpy()
    logits = np.array(served["ids"][:len(label)])
    assert len(label) == schema.read_meta(str(data))["test_rows"] > 0
    log_loss = np.mean(np.maximum(logits, 0) - logits * label + np.log1p(np.exp(-np.abs(logits))))
    assert metrics["eval_rows"] == len(label)
    np.testing.assert_allclose(log_loss, metrics["loss"], rtol=1e-4)
    np.testing.assert_allclose(exact_auc(label, logits), metrics["auc"], rtol=1e-4)
    assert metrics["auc"] > 0.6, "DLRM learned the label's dependence on C1 and I1"


_SERVE_RAW = """
import json, sys
import numpy as np, pyarrow.parquet as pq, tensorflow as tf
ids_export, raw_export, converted, tsv = sys.argv[1:5]
names = ["I%d" % i for i in range(1, 14)] + ["C%d" % i for i in range(1, 27)]
table = pq.read_table(converted)
by_id = tf.saved_model.load(ids_export).signatures["serving_default"]
ids = by_id(**{name: tf.constant(table.column(name).to_numpy().astype(spec.dtype.as_numpy_dtype))
               for name, spec in by_id.structured_input_signature[1].items()})["logits"]
raw = tf.saved_model.load(raw_export).signatures["serving_default"]
signature = raw.structured_input_signature[1]
assert sorted(signature) == sorted(names) and {s.dtype for s in signature.values()} == {tf.string}, signature
fields = [line.split("\\t")[1:] for line in open(tsv).read().splitlines()]
served = raw(**{name: tf.constant([f[i] for f in fields]) for i, name in enumerate(names)})["logits"]
print(json.dumps({"ids": ids.numpy().reshape(-1).tolist(), "raw": served.numpy().reshape(-1).tolist()}))
"""


def _edge_lines(known: str, vocabulary) -> list:
    """Lines the generator never writes: everything missing, negative and large counts, upper-case hex of
    known values, values no training row had (``ffffffff``-sized and 16 digits)."""
    fields = known.split("\t")
    unseen = ["fffffffe", "ffffffffffffffff", "0", "123456789abcdef0", "deadbeef"]
    for i, name in enumerate(schema.CATEGORICAL):
        value = int(unseen[i % len(unseen)], 16)
        assert value not in vocabulary.tables[name][0], f"{unseen[i % len(unseen)]} was seen in {name}"
    return ["\t".join(["0"] + [""] * 39),
            "\t".join(["1", "-3", "123456789012", "0", "-999999999999999999"] + fields[5:14]
                      + [v.upper() for v in fields[14:]]),
            "\t".join(["0"] + fields[1:14] + [unseen[i % len(unseen)] for i in range(26)])]


@pytest.fixture(scope="module")
def served(trained, tmp_path_factory):
    """One plain-TensorFlow process serves both exports: ``{"ids": logits, "raw": logits}``.

    ``--serving_input criteo_raw``, exported from the trained checkpoint by the library's export, on the test
    split's TSV lines and edge cases; the converted-id SavedModel on the same rows converted by the converter
    with the same vocabulary (the test split first, then the edge rows)."""
    import pyarrow as pa

    from collective.integration.export import export_estimator
    from datasets.criteo.convert import convert
    from datasets.criteo.vocab import Vocabulary
    from modelzoo import runner
    from modelzoo.dlrm.model import RECIPE
    from modelzoo.features import serving_input_receiver_fn

    data, model_dir, metrics = trained
    tmp_path = tmp_path_factory.mktemp("criteo-raw")
    meta = schema.read_meta(str(data))
    lines = (data.parent / "train.txt").read_text().splitlines()[meta["train_rows"]:]
    assert len(lines) == meta["test_rows"]
    vocabulary = Vocabulary.load(str(data / meta["vocabulary"]))
    edges = _edge_lines(lines[0], vocabulary)
    (tmp_path / "edges.txt").write_text("\n".join(edges) + "\n")
    convert(str(tmp_path / "edges.txt"), str(tmp_path / "edges"), vocabulary=str(data / meta["vocabulary"]),
            progress=False)
    edge_rows = pq.read_table(str(tmp_path / "edges" / "part-00000.parquet"))
    converted = pa.concat_tables([pq.read_table(str(data / "test")), edge_rows])
    assert converted.num_rows == len(lines) + len(edges)
    assert all(converted.column(name)[-1].as_py() == 0 for name in schema.CATEGORICAL), "unseen values are id 0"
    pq.write_table(converted, str(tmp_path / "converted.parquet"))
    (tmp_path / "raw.tsv").write_text("\n".join(lines + edges) + "\n")

    args = runner.parse(RECIPE, [str(a) for a in ["--data", data, "--model_dir", model_dir, "--serving_input",
                                                  "criteo_raw"] + MODEL_FLAGS])
    dataset = RECIPE.load_data(args, 0)
    receiver = serving_input_receiver_fn(dataset.spec, args.serving_input, args.data)
    export = export_estimator(RECIPE.model_fn, RECIPE.params(args, dataset), None, str(tmp_path / "export"),
                              receiver, str(model_dir)).decode()
    receiver.close()  # the SavedModel must hold its own copy of the vocabulary
    proc = subprocess.run([sys.executable, "-c", _SERVE_RAW, metrics["export_path"], export,
                           str(tmp_path / "converted.parquet"), str(tmp_path / "raw.tsv")],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_raw_criteo_values_serve_what_the_converted_ids_do(served):
    """The test split's TSV lines and the edge cases give the logits that the converted-id SavedModel gives
    on the converted rows."""
    assert len(served["raw"]) == len(served["ids"])
    np.testing.assert_allclose(served["raw"], served["ids"], rtol=1e-5, atol=1e-5)
    assert np.ptp(served["raw"]) > 1e-2, "the rows get different predictions"
