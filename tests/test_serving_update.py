"""Serving updates end to end: train -> full export -> deltas -> new SavedModel versions -> plain-TF serving.

On 1 (this process), 2 and 3 workers (hb; a fixed table ``t`` and a hash
table ``item`` with Adagrad, a dense layer) serving_update_cases trains a
chain (a full save at step 2, deltas at 3, 5, 6), exports version 1 from its
base and updates it to version 2 (deltas 3 and 5) and version 3 (delta 6),
and exports steps 5 and 6 the ordinary way from full checkpoints of the
same run. One process where ``collective`` and ``horovod`` cannot be
imported serves every version and each export base's newest version:
versions 2 and 3 serve what the ordinary exports of their steps serve, and
differ from version 1 on the rows trained since step 2 (new hash keys
included) and nowhere else; they link version 1's variables and add one
delta each. Chains that do not continue a version are refused.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.checkpoint import ChainError, Saver
from collective.integration.serving_update import update_saved_model
from collective.integration.serving_versions import ServingUpdateError, versions

from launcher import WORKERS, run_workers
from workers import incremental_cases as ic
from workers import serving_update_cases as suc

pytestmark = pytest.mark.timeout(900)
COUNTS = (1, 2, 3)
OUTPUTS = ("prediction", "t_rows", "item_rows")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("serving")
    written = {}
    for n in COUNTS:
        if n == 1:
            suc.write_versions(CollectiveStrategy("hb"), str(base / "n1"))
        else:
            run_workers("serving_update_worker.py", n, [base / f"n{n}"], timeout=400)
        written[n] = json.loads((base / f"n{n}" / "versions.json").read_text())
    inputs = base / "inputs.npz"
    np.savez(inputs, **suc.serving_inputs())
    args, outs = [], {}
    for n, found in written.items():
        for name, path in list(found.items()) + [("newest", str(base / f"n{n}" / "export"))]:
            outs[n, name] = base / f"served_n{n}_{name}.npz"
            args += [path, inputs, outs[n, name]]
    proc = subprocess.run([sys.executable, str(WORKERS / "export_serve.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    served = {}
    for key, out in outs.items():
        with np.load(out) as data:
            served[key] = {k: data[k] for k in data.files}
    return {"base": base, "versions": written, "served": served}


def _record(version_dir: str) -> dict:
    return json.loads(open(os.path.join(version_dir, "assets.extra", "collective_checkpoint.json")).read())


@pytest.mark.parametrize("n", COUNTS)
def test_updated_versions_serve_what_an_ordinary_export_of_their_step_serves(run, n):
    written, served = run["versions"][n], run["served"]
    export = run["base"] / f"n{n}" / "export"
    numbers = versions(str(export))
    assert [str(export / str(v)) for v in numbers] == [written["v1"], written["v2"], written["v3"]]
    assert sorted(os.listdir(export)) == sorted(str(v) for v in numbers), "a temporary folder was left"
    assert str(served[n, "newest"]["served_version"]) == written["v3"]
    for version, full in (("v2", "full5"), ("v3", "full6"), ("newest", "full6")):
        for key in OUTPUTS:
            np.testing.assert_allclose(served[n, version][key], served[n, full][key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{n} workers: {version} {key}")
    v2, v3 = _record(written["v2"]), _record(written["v3"])
    assert [d["step"] for d in v2["deltas"]] == [3, 5] and v2["step"] == 5 and v2["previous_version"] == numbers[0]
    assert [d["step"] for d in v3["deltas"]] == [3, 5, 6] and v3["step"] == 6 and v3["previous_version"] == numbers[1]
    assert _record(written["v1"])["step"] == ic.BASE_STEP and _record(written["v1"])["deltas"] == []


def _assert_changed_where_trained(changed: np.ndarray, trained: np.ndarray, table: str) -> None:
    """Rows not trained since version 1 are served as they were; most trained rows changed (a row whose
    gradient is zero, all its features below the ReLU, keeps its value)."""
    assert not changed[~trained].any(), f"{table}: rows not trained since version 1 changed"
    assert changed[trained].sum() >= trained.sum() / 2, f"{table}: {changed[trained].sum()} of {trained.sum()}"


@pytest.mark.parametrize("n", COUNTS)
def test_new_versions_differ_from_version_1_on_the_rows_trained_since(run, n):
    first, last = run["served"][n, "v1"], run["served"][n, "newest"]
    inputs = suc.serving_inputs()
    before, after = range(ic.BASE_STEP), range(ic.BASE_STEP, ic.LAST_STEP)
    trained_ids = np.unique(np.concatenate([ic.global_batch(s)[0].ravel() for s in after]))
    ids = inputs["ids"].ravel()
    changed = np.abs(first["t_rows"] - last["t_rows"]).reshape(len(ids), -1).max(axis=1) > 1e-6
    _assert_changed_where_trained(changed, np.isin(ids, trained_ids), "t")
    keys = inputs["keys"].ravel()
    old_keys = np.unique(np.concatenate([ic.global_batch(s)[1].ravel() for s in before]))
    new_keys = np.setdiff1d(np.concatenate([ic.global_batch(s)[1].ravel() for s in after]), old_keys)
    trained_keys = np.unique(np.concatenate([ic.global_batch(s)[1].ravel() for s in after]))
    first_rows, last_rows = (r["item_rows"].reshape(len(keys), -1) for r in (first, last))
    changed = np.abs(first_rows - last_rows).max(axis=1) > 1e-6
    _assert_changed_where_trained(changed, np.isin(keys, trained_keys), "item")
    assert len(new_keys) >= 2, "the schedule adds keys after the base"
    held_by_v1 = np.abs(first_rows).max(axis=1) > 0
    np.testing.assert_array_equal(held_by_v1, np.isin(keys, old_keys))  # new keys read zeros in version 1 ...
    np.testing.assert_array_equal(np.abs(last_rows).max(axis=1) > 0, keys != suc.UNSEEN_KEY)  # ... and not in 3
    assert np.abs(first["prediction"] - last["prediction"]).max() > 1e-4
    # Version 3 is version 1's bundle (the same files: hard links) plus a delta per update; the deltas hold the
    # rows trained (new hash keys included, appended when the version loads), not the tables.
    files = {v: {name: os.stat(os.path.join(run["versions"][n][v], "variables", name))
                 for name in os.listdir(os.path.join(run["versions"][n][v], "variables"))} for v in ("v1", "v2", "v3")}
    bundle = sorted(files["v1"])
    deltas = [f"delta-00000{k}.{ext}" for k in (1, 2) for ext in ("data-00000-of-00001", "index")]
    assert sorted(files["v3"]) == sorted(bundle + deltas) and sorted(files["v2"]) == sorted(bundle + deltas[:2])
    for name in bundle:
        assert files["v3"][name].st_ino == files["v1"][name].st_ino, name
    assert files["v3"][deltas[0]].st_ino == files["v2"][deltas[0]].st_ino
    second = tf.train.load_checkpoint(os.path.join(run["versions"][n]["v3"], "variables", "delta-000002"))
    assert sorted(second.get_tensor("item/keys").tolist()) == sorted(set(ic.global_batch(5)[1].ravel().tolist()))
    assert sorted(second.get_tensor("t/keys").tolist()) == sorted(set(ic.global_batch(5)[0].ravel().tolist()))


def test_versions_written_by_any_worker_count_serve_the_same_model(run):
    for n in COUNTS[1:]:
        for key in OUTPUTS:
            np.testing.assert_allclose(run["served"][n, "newest"][key], run["served"][1, "newest"][key], rtol=2e-4,
                                       atol=1e-6, err_msg=f"{n} workers against 1: {key}")


def _chain_from(strategy, checkpoint: str, model_dir) -> str:
    """A chain in ``model_dir`` from ``checkpoint`` (step 4): a full save of step 4, one step, a delta of step 5."""
    with strategy.scope(), tf.Graph().as_default():
        train, step, feed = ic.build(strategy)
        saver = Saver(max_to_keep=None)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, checkpoint)
            saver.save(sess, str(model_dir / "model.ckpt"), global_step=step)
            sess.run(train, feed(4, 0, 1))
            return saver.save_incremental(sess, str(model_dir / "model.ckpt"), global_step=step)


def test_chains_that_do_not_continue_the_version_are_refused(run, tmp_path):
    """An older delta, a chain whose base is after the version (a gap), another base, a missing link, a damaged
    new delta, no record: each refused with the version and the delta named, and no version written."""
    n1 = run["base"] / "n1"
    model, reference = n1 / "model", n1 / "reference"
    strategy = CollectiveStrategy("hb")

    def export_of(checkpoint: str, name: str) -> str:
        with strategy.scope():
            return strategy.export_saved_model(str(tmp_path / name), checkpoint,
                                               suc.signature_def_fn(strategy)).decode()

    current = tmp_path / "current"
    shutil.copytree(n1 / "export", current)
    newest = str(current / str(versions(str(current))[-1]))
    gap = export_of(str(model / f"model.ckpt-{ic.BASE_STEP}"), "gap")
    later = _chain_from(strategy, str(reference / "model.ckpt-4"), tmp_path / "later")
    other = export_of(str(reference / "model.ckpt-3"), "other")
    torn = tmp_path / "torn"
    shutil.copytree(model, torn)
    (torn / "model.ckpt-5.delta.manifest.json").unlink()
    corrupted = tmp_path / "corrupted"  # the delta of step 6 damaged, under version 2 (which holds 3 and 5)
    shutil.copytree(model, corrupted)
    data = max(corrupted.glob("model.ckpt-6.delta.data-*"), key=lambda p: p.stat().st_size)
    data.write_bytes(bytes([data.read_bytes()[0] ^ 1]) + data.read_bytes()[1:])
    at_v2 = tmp_path / "at_v2"
    shutil.copytree(n1 / "export", at_v2)
    shutil.rmtree(at_v2 / str(versions(str(at_v2))[-1]))
    no_record = tmp_path / "no_record"
    shutil.copytree(run["versions"][1]["v1"], no_record / "1")
    (no_record / "1" / "assets.extra" / "collective_checkpoint.json").unlink()
    delta = lambda step, folder=model: str(folder / f"model.ckpt-{step}.delta")  # noqa: E731
    cases = [
        (current, delta(5), ServingUpdateError,
         rf"incremental checkpoint {delta(5)} \(step 5\) is not newer than SavedModel version {newest} \(step 6\)"),
        (current, delta(6), ServingUpdateError,
         rf"incremental checkpoint {delta(6)} \(step 6\) is not newer than SavedModel version {newest} \(step 6\)"),
        (tmp_path / "gap", later, ServingUpdateError,
         rf"cannot update SavedModel version {gap} from {later}: the chain of {later} starts at the full checkpoint "
         rf"{tmp_path}/later/model.ckpt-4 \(step 4\), after version {gap}'s step 2: the rows trained between steps "
         r"2 and 4 are in none of its deltas \(a gap\)"),
        (tmp_path / "other", delta(6), ServingUpdateError,
         rf"cannot update SavedModel version {other} from {delta(6)}: version {other} holds {reference}/model.ckpt-3 "
         rf"\(step 3\) plus 0 delta\(s\), but the chain of {delta(6)} starts from the full checkpoint "
         rf"{model}/model.ckpt-2 \(step 2\), whose files differ"),
        (current, delta(6, torn), ChainError, rf"{torn}/model.ckpt-5.delta has no manifest"),
        (at_v2, delta(6, corrupted), ChainError,
         rf"{corrupted}/model.ckpt-6.delta is torn: its file {data.name} does not match its manifest's SHA-256"),
        (no_record, delta(6), ServingUpdateError,
         rf"SavedModel version {no_record}/1 has no assets.extra/collective_checkpoint.json"),
    ]
    for export_base, chain_end, error, message in cases:
        before = sorted(os.listdir(export_base))
        with pytest.raises(error, match=message):
            update_saved_model(str(export_base), chain_end)
        assert sorted(os.listdir(export_base)) == before, (export_base, chain_end)


EVICTING = {"steps_to_live": 1, "evict_every_steps": 1, "default_value": 0.5}
POLICY_BATCHES = ([1, 2, 3, 4], [1, 2, 5, 6], [1, 7], [2, 8])  # keys not looked up for a step are evicted
POLICY_KEYS = np.arange(1, 10, dtype=np.int64)


def _policy_signature(strategy):
    from collective.embedding.hash_table import hash_embedding_variable  # pylint: disable=import-outside-toplevel

    def build():
        keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
        with strategy.embedding_scope():
            table = hash_embedding_variable("pol", dim=3, capacity_per_worker=64, **EVICTING)
        return tf.compat.v1.saved_model.predict_signature_def({"keys": keys},
                                                              {"rows": tf.nn.embedding_lookup(table, keys)})

    return build


def _train_policy_table(strategy, model_dir, full_steps, delta_steps) -> None:
    """One worker trains ``pol`` (keys evicted one step after their last lookup) on POLICY_BATCHES."""
    from collective.embedding.hash_table import hash_embedding_variable  # pylint: disable=import-outside-toplevel

    with strategy.scope(), tf.Graph().as_default():
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        with strategy.embedding_scope():
            table = hash_embedding_variable("pol", dim=3, capacity_per_worker=64, **EVICTING)
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, keys) - 1.0))
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step)
        saver = Saver(max_to_keep=None)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for done, batch in enumerate(POLICY_BATCHES, 1):
                sess.run(train, {keys: batch})
                if done in full_steps:
                    saver.save(sess, str(model_dir / "model.ckpt"), global_step=done)
                elif done in delta_steps:
                    saver.save_incremental(sess, str(model_dir / "model.ckpt"), global_step=done)


def _served_rows(version_dir: str) -> np.ndarray:
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], version_dir)
        signature = meta.signature_def[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
        return sess.run(signature.outputs["rows"].name, {signature.inputs["keys"].name: POLICY_KEYS})


def test_keys_a_vocabulary_policy_evicts_are_dropped_from_the_next_version(tmp_path):
    """A hash table with eviction: the delta's tombstones remove keys from the version's lookup table, so the
    updated version serves the policy's default for them, as an ordinary export of that step does."""
    strategy = CollectiveStrategy("hb")
    _train_policy_table(strategy, tmp_path / "chain", full_steps={2}, delta_steps={3, 4})
    _train_policy_table(strategy, tmp_path / "reference", full_steps={4}, delta_steps=set())
    with strategy.scope():
        first = strategy.export_saved_model(str(tmp_path / "export"), str(tmp_path / "chain" / "model.ckpt-2"),
                                            _policy_signature(strategy)).decode()
        reference = strategy.export_saved_model(str(tmp_path / "reference_export"),
                                                str(tmp_path / "reference" / "model.ckpt-4"),
                                                _policy_signature(strategy)).decode()
    updated = update_saved_model(str(tmp_path / "export"), str(tmp_path / "chain")).decode()
    evicted = set()
    for step in (3, 4):
        reader = tf.train.load_checkpoint(str(tmp_path / "chain" / f"model.ckpt-{step}.delta"))
        if reader.has_tensor("pol/tombstones/keys"):
            evicted |= set(reader.get_tensor("pol/tombstones/keys").tolist())
    rows = {name: _served_rows(path) for name, path in (("v1", first), ("v2", updated), ("ref", reference))}
    np.testing.assert_allclose(rows["v2"], rows["ref"], rtol=1e-6)
    default = {name: set(POLICY_KEYS[np.all(r == 0.5, axis=1)].tolist()) for name, r in rows.items()}
    dropped = evicted & (set(POLICY_KEYS.tolist()) - default["v1"]) & default["v2"]
    assert len(dropped) >= 2, (evicted, default)  # held by version 1, evicted since: the default in version 2
    assert default["v2"] != default["v1"]
