"""Incremental checkpoints: deltas of the rows trained, chains restored on any worker count, torn deltas refused.

Chains (a full save at step 2, deltas at steps 3, 5 and 6) are written on 1
(this process), 2 (hb) and 3 (sok) workers; every chain end is restored on
1, 2 and 3 workers and saved again as a full checkpoint, which must equal
the uninterrupted run's full checkpoint of that step (this process, one
worker, a full save every step): the table, the dense variables and their
Adagrad slots, and the hash table key by key. The 2-worker launch ends by
dying (SIGKILL) inside a delta save, after the delta's files are merged and
before its manifest is written.
"""

import json
import logging
import os
import pathlib
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.checkpoint import ChainError, CheckpointError, Saver, latest_incremental_checkpoint, touched

from launcher import run_workers, start_workers
from test_restart import START_TIMEOUT, Output, read_pid, still_running
from workers import incremental_cases as ic

pytestmark = pytest.mark.timeout(900)
HOLD_STEP = ic.DELTA_STEPS[1]
WRITERS = {"c1": 1, "c2": 2, "c3": 3}
# (source chain, restoring world size): every chain on every world size, N -> M and N -> N.
RESTORES = [("c1", 2), ("c2", 2), ("c2", 3), ("c3", 3), ("c3", 1)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Writes the reference and the chains, restores them, and kills a 2-worker job inside a delta save."""
    base = tmp_path_factory.mktemp("incremental")
    one = CollectiveStrategy("hb")
    ic.train_chain(one, str(base / "ref"), full_every_step=True)
    ic.train_chain(one, str(base / "c1"))
    proc = start_workers("incremental_worker.py", 2, [base, "hb", base / "pids2", "write:c2", "restore:c1,c2",
                                                      "kill:k2"])
    output = Output(proc.stdout)
    try:
        output.wait_for(f"[0] rank 0 holding before the manifest of step {HOLD_STEP}", START_TIMEOUT)
        os.kill(read_pid(base / "pids2", 0), signal.SIGKILL)
        killed_code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output.join()
    left = still_running([read_pid(base / "pids2", r) for r in range(2)], "incremental_worker.py")
    three = run_workers("incremental_worker.py", 3, [base, "sok", base / "pids3", "write:c3", "restore:c2,c3",
                                                     "mts:m3:4", "mts:m3:6"], timeout=400)
    ic.restore_chains(one, [str(base / "c3")], str(base / "restored" / "to1"))
    logging.getLogger(__name__).info("launches:\n%s\n%s", "\n".join(
        line for line in output.text().splitlines() if " done " in line), "\n".join(
        line for line in three.stdout.splitlines() if " done " in line))
    return {"base": base, "killed_code": killed_code, "killed_output": output.text(), "left": left,
            "three": three.stdout}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_delta_holds_only_the_rows_trained_since_the_save_before(run, name):
    previous = ic.BASE_STEP
    for step in ic.DELTA_STEPS:
        manifest = json.loads((run["base"] / name / f"model.ckpt-{step}.delta.manifest.json").read_text())
        ids, keys = ic.changed(range(previous, step))
        assert manifest["rows"] == {"t": ids, "item": keys}, (name, step)
        assert manifest["world_size"] == WRITERS[name] and manifest["step"] == step
        assert manifest["previous"] == (f"model.ckpt-{previous}.delta" if previous != ic.BASE_STEP else None)
        assert manifest["base"]["prefix"] == f"model.ckpt-{ic.BASE_STEP}"
        previous = step
    # The same rows are stored as keys + rows: plain TensorFlow reads a delta.
    reader = tf.compat.v1.train.NewCheckpointReader(str(run["base"] / name / f"model.ckpt-{ic.DELTA_STEPS[1]}.delta"))
    ids = reader.get_tensor("t/keys")
    assert sorted(ids.tolist()) == sorted(np.unique(np.concatenate(
        [ic.global_batch(s)[0].ravel() for s in range(ic.DELTA_STEPS[0], ic.DELTA_STEPS[1])])).tolist())
    assert reader.get_tensor("t").shape == (len(ids), ic.DIM) == reader.get_tensor("t/Adagrad").shape


@pytest.mark.parametrize("source, m", RESTORES)
def test_chain_restored_on_m_workers_equals_the_uninterrupted_run(run, source, m):
    for step in ic.DELTA_STEPS:
        ic.assert_same_model(str(run["base"] / "restored" / f"to{m}" / source / f"model.ckpt-{step}"),
                             str(run["base"] / "ref" / f"model.ckpt-{step}"),
                             f"chain of {WRITERS[source]} workers to step {step}, restored on {m}")


def test_kill_during_a_delta_save_leaves_the_previous_delta_restorable(run, tmp_path):
    assert run["killed_code"] == 137, run["killed_output"][-4000:]
    assert run["left"] == []
    model_dir = run["base"] / "k2"
    killed = model_dir / f"model.ckpt-{HOLD_STEP}.delta"
    assert pathlib.Path(str(killed) + ".index").exists()  # merged, never committed
    assert not pathlib.Path(str(killed) + ".manifest.json").exists()
    previous = str(model_dir / f"model.ckpt-{ic.DELTA_STEPS[0]}.delta")
    assert latest_incremental_checkpoint(str(model_dir)) == previous
    restored = _restore_and_save(previous, tmp_path)
    ic.assert_same_model(restored, str(run["base"] / "ref" / f"model.ckpt-{ic.DELTA_STEPS[0]}"), "after the kill")
    with pytest.raises(ChainError, match=rf"model.ckpt-{HOLD_STEP}.delta has no manifest .*its save never completed"
                                         rf".* The last complete step is {ic.DELTA_STEPS[0]}: restore it with "
                                         rf"saver.restore\(sess, '.*model.ckpt-{ic.DELTA_STEPS[0]}.delta'\)"):
        _restore_and_save(str(killed), tmp_path / "refused")


def test_a_torn_or_missing_delta_is_refused_with_its_name_and_the_last_complete_step(run, tmp_path):
    """Regression-style: truncated, corrupted and missing links of a chain are refused before anything is read."""
    first, second, last = ic.DELTA_STEPS
    # The largest data file of the second delta (the merge keeps one per part).
    data = max((run["base"] / "c2").glob(f"model.ckpt-{second}.delta.data-*"), key=lambda p: p.stat().st_size).name
    cases = {
        "truncated": (data, lambda p: p.write_bytes(p.read_bytes()[:-8]),
                      rf"model.ckpt-{second}.delta is torn: its file {data} has "
                      rf"\d+ bytes, its manifest says \d+\. The last complete step is {first}"),
        "corrupted": (data,
                      lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:]),
                      rf"model.ckpt-{second}.delta is torn: its file .* does not match its manifest's SHA-256 "
                      rf"checksum\. The last complete step is {first}"),
        "missing": (f"model.ckpt-{first}.delta.manifest.json", lambda p: p.unlink(),
                    rf"model.ckpt-{first}.delta has no manifest .* The last complete step is {ic.BASE_STEP}: "
                    rf"restore it with saver.restore\(sess, '.*model.ckpt-{ic.BASE_STEP}'\)"),
    }
    for case, (name, damage, message) in cases.items():
        model_dir = tmp_path / case
        shutil.copytree(run["base"] / "c2", model_dir)
        damage(model_dir / name)
        with pytest.raises(ChainError, match=message):
            _restore_and_save(str(model_dir / f"model.ckpt-{last}.delta"), tmp_path / f"{case}_out")


def test_monitored_training_session_writes_deltas_and_resumes_from_the_chain(run, tmp_path):
    """MonitoredTrainingSession(save_incremental_checkpoint_steps=1) on 3 workers, run to step 4, then to 6."""
    for r in range(3):
        assert f"[{r}] rank {r} mts started at step 0" in run["three"], run["three"][-4000:]
        assert f"[{r}] rank {r} mts started at step 4" in run["three"], run["three"][-4000:]
    model_dir = run["base"] / "m3"
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-1")  # the hook's first save
    for step in range(2, 7):
        manifest = json.loads((model_dir / f"model.ckpt-{step}.delta.manifest.json").read_text())
        assert manifest["previous"] == (f"model.ckpt-{step - 1}.delta" if step > 2 else None)
        assert manifest["rows"] == dict(zip(("t", "item"), ic.changed([step - 1])))
    latest = latest_incremental_checkpoint(str(model_dir))
    assert latest == str(model_dir / "model.ckpt-6.delta")
    ic.assert_same_model(_restore_and_save(latest, tmp_path), str(run["base"] / "ref" / "model.ckpt-6"), "MTS")


def test_save_incremental_needs_a_base_and_adam_deltas_hold_every_row(tmp_path):
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        train, step, feed = ic.build(strategy)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(CheckpointError, match="needs a full checkpoint to chain to"):
                Saver().save_incremental(sess, str(tmp_path / "model.ckpt"), global_step=step)
    v1, keras = tf.compat.v1.train, tf.keras.optimizers
    assert touched.updates_only_gradient_rows(v1.AdagradOptimizer(0.1))
    assert touched.updates_only_gradient_rows(keras.SGD(0.1)) and not touched.updates_only_gradient_rows(
        keras.SGD(0.1, momentum=0.9))
    assert not touched.updates_only_gradient_rows(v1.AdamOptimizer(0.1))
    assert not touched.updates_only_gradient_rows(keras.Adam(0.1))
    from collective import hb, sok  # pylint: disable=import-outside-toplevel

    assert touched.updates_only_gradient_rows(hb.train.AdagradOptimizer(0.1))
    assert touched.updates_only_gradient_rows(sok.LazyAdamOptimizer(0.1))
    # Adam moves every row at every step: its deltas hold every row, and the chain is still exact.
    with strategy.scope(), tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("adam_t", [7, 2], initializer=tf.compat.v1.ones_initializer())
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train = v1.AdamOptimizer(0.1).minimize(tf.reduce_sum(tf.nn.embedding_lookup(table, ids)),
                                               global_step=global_step)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: [1, 2]})
            saver.save(sess, str(tmp_path / "adam" / "model.ckpt"), global_step=global_step)
            sess.run(train, {ids: [3]})
            delta = saver.save_incremental(sess, str(tmp_path / "adam" / "model.ckpt"), global_step=global_step)
            want = sess.run([table, *[v for v in tf.compat.v1.global_variables() if "Adam" in v.op.name]])
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, delta)
            got = sess.run([table, *[v for v in tf.compat.v1.global_variables() if "Adam" in v.op.name]])
    assert tf.compat.v1.train.NewCheckpointReader(delta).get_tensor("adam_t/keys").tolist() == list(range(7))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _restore_and_save(prefix: str, out_dir: pathlib.Path) -> str:
    """Restores ``prefix`` (a chain end) in this process (one worker) and saves it as a full checkpoint."""
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        _, step, _ = ic.build(strategy)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, prefix)
            return saver.save(sess, str(out_dir / "model.ckpt"), global_step=step)
