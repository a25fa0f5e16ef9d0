"""Incremental checkpoints: deltas of the rows trained, chains restored on any worker count, torn deltas refused.

Chains (a full save at step 2, deltas at steps 3, 5 and 6) are written on 1
(this process), 2 (hb) and 3 (sok, both tables placed table_wise: the
dense table on rank 0, the hash table on rank 1) workers; every chain end is restored row-wise on
1 and 2 workers and table-wise on 3, and saved again as a full checkpoint, which must equal
the uninterrupted run's full checkpoint of that step (this process, one
worker, a full save every step): the table, the dense variables and their
Adagrad slots, and the hash table key by key. The 2-worker launch ends in
MonitoredTrainingSession, a delta every step, killed (SIGKILL) inside a
delta save after the delta's files are merged and before its manifest is
written; the 3-worker launch resumes it from its newest complete delta.
"""

import contextlib
import json
import logging
import os
import pathlib
import re
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.checkpoint import (ChainError, CheckpointError, CheckpointMismatchError, Saver,
                                  latest_incremental_checkpoint, manifest, touched)

from launcher import run_workers, start_workers
from test_restart import START_TIMEOUT, Output, read_pid, still_running
from workers import incremental_cases as ic

pytestmark = pytest.mark.timeout(900)
HOLD_STEP = 3  # the MTS job (a full save at step 1, a delta every step) dies inside the save of this delta
WRITERS = {"c1": 1, "c2": 2, "c3": 3}
# (source chain, restoring world size): every chain on every world size, N -> M and N -> N.
RESTORES = [("c1", 2), ("c2", 2), ("c2", 3), ("c3", 3), ("c3", 1)]


@pytest.fixture(scope="module")
def restore_and_save():
    """``restore_and_save(prefix, out_dir)``: restores a chain end in this process (one worker, one graph for every
    test) and saves it as a full checkpoint; returns its prefix."""
    strategy = CollectiveStrategy("hb")
    graph = tf.Graph()
    with strategy.scope(), graph.as_default():
        _, step, _ = ic.build(strategy)
        saver = Saver(max_to_keep=None)
    sess = tf.compat.v1.Session(graph=graph)

    def restore_and_save_(prefix: str, out_dir: pathlib.Path) -> str:
        with strategy.scope(), graph.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, prefix)
            return saver.save(sess, str(out_dir / "model.ckpt"), global_step=step)

    yield restore_and_save_
    sess.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory, restore_and_save):
    """Writes the reference and the chains, restores them; kills a 2-worker MTS job inside a delta save and
    resumes it on 3 workers."""
    base = tmp_path_factory.mktemp("incremental")
    one = CollectiveStrategy("hb")
    ic.train_chain(one, str(base / "ref"), full_every_step=True)
    ic.train_chain(one, str(base / "c1"))
    proc = start_workers("incremental_worker.py", 2, [base, "hb", base / "pids2", "write:c2", "restore:c1,c2",
                                                      f"hold:{HOLD_STEP}", "mts:m2:4"])
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
    killed = {"code": killed_code, "output": output.text(), "files": sorted(p.name for p in (base / "m2").iterdir()),
              "left": still_running([read_pid(base / "pids2", r) for r in range(2)], "incremental_worker.py"),
              "latest": latest_incremental_checkpoint(str(base / "m2"))}
    killed["restored"] = restore_and_save(killed["latest"], base / "after_kill")
    try:
        restore_and_save(str(base / "m2" / f"model.ckpt-{HOLD_STEP}.delta"), base / "refused")
    except ChainError as err:
        killed["refused"] = str(err)
    three = run_workers("incremental_worker.py", 3, [base, "sok", base / "pids3", "write:c3:table_wise",
                                                     "restore:c2,c3:table_wise", "mts:m2:6"], timeout=400)
    for step in ic.DELTA_STEPS:
        restore_and_save(str(base / "c3" / f"model.ckpt-{step}.delta"), base / "restored" / "to1" / "c3")
    logging.getLogger(__name__).info("workers' times:\n%s", "\n".join(
        line for line in (output.text() + "\n" + three.stdout).splitlines() if " done " in line))
    return {"base": base, "killed": killed, "resumed_output": three.stdout}


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
        placements = {t["name"]: t["placement"] for t in manifest["plan"]["tables"]}
        assert placements == dict.fromkeys(ic.TABLES, "table_wise" if name == "c3" else "row_wise"), (name, step)
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


def test_kill_during_a_delta_save_leaves_the_previous_delta_restorable(run):
    """MonitoredTrainingSession on 2 workers, a delta every step; rank 0 is killed between merge and manifest."""
    killed = run["killed"]
    assert killed["code"] == 137, killed["output"][-4000:]
    assert killed["left"] == []
    assert f"model.ckpt-{HOLD_STEP}.delta.index" in killed["files"]  # merged, never committed
    assert f"model.ckpt-{HOLD_STEP}.delta.manifest.json" not in killed["files"]
    previous = str(run["base"] / "m2" / f"model.ckpt-{HOLD_STEP - 1}.delta")
    assert killed["latest"] == previous
    ic.assert_same_model(killed["restored"], str(run["base"] / "ref" / f"model.ckpt-{HOLD_STEP - 1}"), "after the kill")
    assert re.search(rf"model.ckpt-{HOLD_STEP}.delta has no manifest .*its save never completed. The last complete "
                     rf"step is {HOLD_STEP - 1}: restore it with saver.restore\(sess, '{re.escape(previous)}'\)",
                     killed.get("refused", "")), killed.get("refused")


def test_a_torn_or_missing_delta_is_refused_with_its_name_and_the_last_complete_step(run, restore_and_save, tmp_path):
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
            restore_and_save(str(model_dir / f"model.ckpt-{last}.delta"), tmp_path / f"{case}_out")


def test_monitored_training_session_resumes_from_the_chain_on_another_worker_count(run, restore_and_save, tmp_path):
    """The killed 2-worker MTS job reruns on 3 workers from its newest complete delta, to step 6."""
    for r in range(2):
        assert f"[{r}] rank {r} mts started at step 0" in run["killed"]["output"]
    for r in range(3):
        assert f"[{r}] rank {r} mts started at step {HOLD_STEP - 1}" in run["resumed_output"], \
            run["resumed_output"][-4000:]
    model_dir = run["base"] / "m2"
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-1")  # the hook's first save
    for step in range(2, 7):
        manifest = json.loads((model_dir / f"model.ckpt-{step}.delta.manifest.json").read_text())
        assert manifest["previous"] == (f"model.ckpt-{step - 1}.delta" if step > 2 else None)
        assert manifest["world_size"] == (2 if step < HOLD_STEP else 3)
        assert manifest["rows"] == dict(zip(("t", "item"), ic.changed([step - 1])))
    # The rerun rewrote the killed, uncommitted delta: no file of the killed save is left over.
    assert sorted(p.name for p in model_dir.glob(f"model.ckpt-{HOLD_STEP}.delta*")) == sorted(
        [f"model.ckpt-{HOLD_STEP}.delta.index", f"model.ckpt-{HOLD_STEP}.delta.manifest.json"] + [
            entry["name"] for entry in json.loads((model_dir / f"model.ckpt-{HOLD_STEP}.delta.manifest.json")
                                                  .read_text())["files"] if ".data-" in entry["name"]])
    latest = latest_incremental_checkpoint(str(model_dir))
    assert latest == str(model_dir / "model.ckpt-6.delta")
    ic.assert_same_model(restore_and_save(latest, tmp_path), str(run["base"] / "ref" / "model.ckpt-6"), "MTS")


def test_a_save_by_another_saver_makes_the_next_delta_a_full_checkpoint(tmp_path, caplog):
    """Regression: the touched-row marks are shared by the graph's Savers. A full save by a second Saver (a
    best-model copy elsewhere) cleared them, and the chain's next delta left out the rows changed before it: the
    chain restored them stale, without an error. That save_incremental now writes a full checkpoint."""
    strategy = CollectiveStrategy("hb")
    chain_dir, best_dir = tmp_path / "chain" / "model.ckpt", tmp_path / "best" / "model.ckpt"

    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("t", [8, 2], initializer=tf.compat.v1.ones_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
        return ids, table, tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss, global_step=step)

    with strategy.scope(), tf.Graph().as_default():
        ids, table, train = build()
        chain, best = Saver(), Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            chain.save(sess, str(chain_dir), global_step=0)
            sess.run(train, {ids: [1, 2]})
            best.save(sess, str(best_dir), global_step=1)
            sess.run(train, {ids: [5]})
            with caplog.at_level(logging.WARNING, logger="collective.checkpoint"):
                fallback = chain.save_incremental(sess, str(chain_dir), global_step=2)
            sess.run(train, {ids: [6]})
            delta = chain.save_incremental(sess, str(chain_dir), global_step=3)
            want = sess.run(table)
    assert fallback == f"{chain_dir}-2" and "another Saver saved or restored a checkpoint" in caplog.text
    assert delta == f"{chain_dir}-3.delta"
    with strategy.scope(), tf.Graph().as_default():
        ids, table, train = build()
        with tf.compat.v1.Session() as sess:
            Saver().restore(sess, delta)
            np.testing.assert_array_equal(sess.run(table), want)
    assert not np.all(want[[1, 2, 5, 6]] == 1.0)


def test_save_incremental_needs_a_base_and_a_new_step_and_adam_deltas_hold_every_row(tmp_path):
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        train, step, feed = ic.build(strategy)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(CheckpointError, match="needs a full checkpoint to chain to"):
                Saver().save_incremental(sess, str(tmp_path / "model.ckpt"), global_step=step)
    v1, keras = tf.compat.v1.train, tf.keras.optimizers
    assert touched.updates_only_gradient_rows(v1.AdagradOptimizer(0.1))
    # Regression: GradientDescentOptimizer implements only _resource_apply_sparse_duplicate_indices and was taken
    # for an optimizer that moves every row (its deltas held every row).
    assert touched.updates_only_gradient_rows(v1.GradientDescentOptimizer(0.1))
    assert touched.updates_only_gradient_rows(v1.MomentumOptimizer(0.1, 0.9))
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
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session() as sess:
            sess.run(init)
            sess.run(train, {ids: [1, 2]})
            saver.save(sess, str(tmp_path / "adam" / "model.ckpt"), global_step=global_step)
            sess.run(train, {ids: [3]})
            # The delta ops are built by the first incremental save, into the finalized graph.
            assert not [op for op in sess.graph.get_operations() if "delta" in op.name]
            sess.graph.finalize()
            delta = saver.save_incremental(sess, str(tmp_path / "adam" / "model.ckpt"), global_step=global_step)
            # Full checkpoints and deltas record the plan they were saved under (issue 43).
            assert manifest.read_plan(str(tmp_path / "adam" / "model.ckpt-1")) == manifest.read_plan(delta) \
                == strategy.plan and strategy.plan["adam_t"].placement == "row_wise"
            with pytest.raises(CheckpointError, match=r"model.ckpt-2.delta is already the end of the chain"):
                saver.save_incremental(sess, str(tmp_path / "adam" / "model.ckpt"), global_step=global_step)
            want = sess.run([table, *[v for v in tf.compat.v1.global_variables() if "Adam" in v.op.name]])
            sess.run(init)
            saver.restore(sess, delta)
            got = sess.run([table, *[v for v in tf.compat.v1.global_variables() if "Adam" in v.op.name]])
    assert tf.compat.v1.train.NewCheckpointReader(delta).get_tensor("adam_t/keys").tolist() == list(range(7))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)




def _small_model(strategy):
    """``(ids, table, train op, global step)``: an 8 x 2 table trained by Adagrad (one process)."""
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    with strategy.embedding_scope():
        table = tf.compat.v1.get_variable("t", [8, 2], initializer=tf.compat.v1.ones_initializer())
    step = tf.compat.v1.train.get_or_create_global_step()
    loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
    return ids, table, tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss, global_step=step), step


@contextlib.contextmanager
def _small_session(tmp_path):
    """``(session, Saver, checkpoint path, ids, table, train op, step)`` of :func:`_small_model`, initialised."""
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        ids, table, train, step = _small_model(strategy)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            yield sess, Saver(), str(tmp_path / "model.ckpt"), ids, table, train, step


def test_a_chain_that_mixes_two_training_histories_is_refused(tmp_path):
    """Regression (issue 40, 1): a manifest named its predecessor by file name only. Restoring an older step and
    training on (as a ChainError advises) replaced deltas 2-3, but the old 4 -> 3 -> 2 -> 1 verified link by link:
    latest_incremental_checkpoint returned the abandoned old delta 4 and restore loaded a model of neither history.
    Now each manifest records its predecessor's SHA-256, and a delta save retires the later steps' deltas."""
    with _small_session(tmp_path) as (sess, saver, path, ids, table, train, step):
        saver.save(sess, path, global_step=step)
        for batch in ([1], [2], [3], [4]):
            sess.run(train, {ids: batch})
            saver.save_incremental(sess, path, global_step=step)
        old_four = {p.name: p.read_bytes() for p in tmp_path.glob("model.ckpt-4.delta*")}
        saver.restore(sess, f"{path}-1.delta")
        for batch in ([5, 6], [7]):
            sess.run(train, {ids: batch})
            saver.save_incremental(sess, path, global_step=step)
        want = sess.run(table)
    assert not list(tmp_path.glob("model.ckpt-4.delta*"))  # retired by the save of step 3
    assert latest_incremental_checkpoint(str(tmp_path)) == f"{path}-3.delta"
    for name, data in old_four.items():  # the abandoned delta copied back (say, from another copy of the model_dir)
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ChainError, match=r"model.ckpt-4.delta: its predecessor .*model.ckpt-3.delta is not the delta "
                                         r"it was saved after .* The last complete step is 3"):
        manifest.verify_chain(f"{path}-4.delta")
    assert latest_incremental_checkpoint(str(tmp_path)) == f"{path}-3.delta"
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        _, table, _, _ = _small_model(strategy)
        with tf.compat.v1.Session() as sess:
            Saver().restore(sess, latest_incremental_checkpoint(str(tmp_path)))
            np.testing.assert_array_equal(sess.run(table), want)


def _chain_of_a_small_table(tmp_path, sharded: bool, use_resource: bool, second_batch):
    """One process's chain (full save, one delta) of a 2 x 2 table ``t`` trained by Adagrad, made inside
    ``embedding_scope()`` (``sharded``: a delta holds its rows by key) or outside (an ordinary variable, as a
    table with fewer rows than workers is: a delta holds it whole); ``(delta, [t, t/Adagrad])``."""
    strategy = CollectiveStrategy("hb")
    path = str(tmp_path / f"{sharded}-{use_resource}" / "model.ckpt")
    with strategy.scope(), tf.Graph().as_default():
        ids, variables, train = _small_table(strategy, sharded, use_resource)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: [0, 1]})
            saver.save(sess, path, global_step=1)
            sess.run(train, {ids: second_batch})
            return saver.save_incremental(sess, path, global_step=2), sess.run(variables)


def _small_table(strategy, sharded: bool, use_resource: bool):
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    with strategy.embedding_scope() if sharded else contextlib.nullcontext():
        table = tf.compat.v1.get_variable("t", [2, 2], initializer=tf.compat.v1.ones_initializer(),
                                          use_resource=use_resource)
    loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids)))
    train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
    return ids, [table] + [v for v in tf.compat.v1.global_variables() if v.op.name == "t/Adagrad"], train


def _restore_small_table(delta: str, sharded: bool, use_resource: bool) -> list:
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        _, variables, _ = _small_table(strategy, sharded, use_resource)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            Saver().restore(sess, delta)
            got = sess.run(variables)
    assert len(got) == 2
    return got


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_a_delta_of_a_table_held_whole_restores_where_the_table_is_sharded(tmp_path, use_resource):
    """Regression (issue 42, seed 8030's p76/p175/p288/p289): a table with fewer rows than workers is an ordinary
    variable, and a delta holds it and its slots whole (no ``/keys``). Resumed on 1 worker, where the table is
    sharded, the chain's restore read it as keyed rows, found none and left the base's rows (a step stale). Here
    one process writes the chain with the table an ordinary variable and restores it sharded; resource and
    reference (TF1) variables."""
    delta, want = _chain_of_a_small_table(tmp_path, False, use_resource, [0])
    assert "t/keys" not in dict(tf.train.list_variables(delta))
    for name, got, value in zip(("t", "t/Adagrad"), _restore_small_table(delta, True, use_resource), want):
        np.testing.assert_array_equal(got, value, err_msg=name)


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_a_delta_of_some_rows_of_a_sharded_table_is_refused_where_the_table_is_an_ordinary_variable(
        tmp_path, use_resource):
    """The other way (issue 42): where a delta was written the table was sharded and the delta holds the rows
    trained since the base by key; where the table is an ordinary variable (fewer rows than workers) the chain's
    last delta is read whole. All rows in order restore; some rows (or rows in another order: a row-wise table
    of 4 rows written by 2 workers holds keys 0, 2, 1, 3) were a [1, 2] table under TF2, silently, and are now
    refused (before anything is written), naming the table."""
    delta, want = _chain_of_a_small_table(tmp_path, True, use_resource, [0, 1])
    for name, got, value in zip(("t", "t/Adagrad"), _restore_small_table(delta, False, use_resource), want):
        np.testing.assert_array_equal(got, value, err_msg=name)
    delta, _ = _chain_of_a_small_table(tmp_path / "some", True, use_resource, [0])
    with pytest.raises(CheckpointMismatchError, match=r"table t: delta .*model.ckpt-2.delta holds 1 of its 2 rows "
                                                       r"by key.* Resume this chain on at most 2 workers"):
        _restore_small_table(delta, False, use_resource)


def test_a_damaged_base_is_refused_before_anything_is_written(tmp_path):
    """Regression (issue 40, 7): the chain check compared the base's index checksum and its data files' sizes
    only; a flipped byte in a data file passed, and the restore failed with TensorFlow's DataLossError after
    variables were written. The base's data files are now checked against the SHA-256 its chain recorded."""
    with _small_session(tmp_path) as (sess, saver, path, ids, table, train, step):
        sess.run(train, {ids: [1, 2]})
        saver.save(sess, path, global_step=step)
        sess.run(train, {ids: [3]})
        delta = saver.save_incremental(sess, path, global_step=step)
        data = max(tmp_path.glob("model.ckpt-1.data-*"), key=lambda p: p.stat().st_size)
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 1
        data.write_bytes(bytes(raw))
        sess.run([table.assign(tf.fill([8, 2], 7.0)), step.assign(42)])
        with pytest.raises(ChainError, match=rf"its base checkpoint {re.escape(path)}-1 is damaged: its file "
                                             rf"{data.name} does not match the SHA-256"):
            saver.restore(sess, delta)
        np.testing.assert_array_equal(sess.run(table), np.full([8, 2], 7.0))  # nothing was written
        assert sess.run(step) == 42
