"""Checkpoints of whole logical tables: contents, N-to-M restore, kill-and-resume, crash mid-save, bad input.

Workers train embedding_cases' model (two sharded tables with Adam slots, a
dense layer) on their share of each global batch; every checkpoint is
compared with one process training on the whole batches. A hash-table
vocabulary (sok backend) is compared key by key with a one-worker run.
"""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.checkpoint import CheckpointMismatchError, ModelDirError, Saver, check_model_dir, manifest
from collective.checkpoint.layout import block_bounds, restore_rows
from collective.checkpoint.manifest import read_plan
from collective.embedding.layout import ShardLayout
from collective.sharding.layouts.table_wise import TableWiseLayout
from collective.sharding.plan import PlanError

from graphs import while_loops
from launcher import launch_once, load_rank_results, run_workers
from workers import checkpoint_cases as cc
from workers import derived_cases as dc
from workers import placement_chain as chain

# Several launches share one module fixture: on a loaded 2-core machine they outlast the default timeout.
pytestmark = pytest.mark.timeout(2400)
BACKENDS = ("hb", "sok", "replicated")
# (world size, sources restored): writes with 1, 2, 3 workers and restores every (N, M) pair once.
LAUNCHES = [(1, "reference", []), (2, "write", [1, 2]), (3, "write", [1, 2, 3]), (1, "nowrite", [1, 2, 3]),
            (2, "nowrite", [3])]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    base = tmp_path_factory.mktemp("matrix")
    for n, write, sources in LAUNCHES:
        run_workers("checkpoint_worker.py", n, [base, write, *sources], timeout=400)
    return base


@pytest.fixture(scope="module")
def reference():
    return {2: cc.reference(2), 3: cc.reference(3), 6: cc.reference(6)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_checkpoint_holds_the_logical_tables(matrix, reference, backend, n):
    path = str(matrix / backend / f"n{n}" / "model.ckpt-2")
    cc.assert_checkpoint_equals(path, reference[2], f"written by {n} workers")
    shapes = tf.compat.v1.train.NewCheckpointReader(path).get_variable_to_shape_map()
    assert shapes["t1"] == [cc.cases.VOCAB, cc.cases.DIM] and shapes["t2/Adam_1"] == [cc.cases.VOCAB, cc.cases.DIM]


@pytest.mark.parametrize("backend, n, m", [("hb", n, m) for n in (1, 2, 3) for m in (1, 2, 3)]
                         + [(b, n, m) for b in ("sok", "replicated") for n, m in ((2, 3), (3, 2))])
def test_n_to_m_restore_continues_as_uninterrupted(matrix, reference, backend, n, m):
    cc.assert_checkpoint_equals(str(matrix / backend / f"from{n}to{m}" / "model.ckpt-3"), reference[3],
                                f"written by {n}, restored by {m} workers")


def test_plain_tensorflow_saver_restores_the_checkpoint(matrix, reference):
    """Full-size variables in one plain TensorFlow process read a 3-worker checkpoint."""
    with tf.Graph().as_default():
        cc.build()
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, str(matrix / "hb" / "n3" / "model.ckpt-2"))
            values = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
    for key in cc.TABLE_KEYS + cc.DENSE_KEYS:
        np.testing.assert_allclose(values[key], reference[2][key], rtol=2e-4, atol=1e-6, err_msg=key)


def test_hb_monitored_training_session_resume_keeps_each_workers_hash_index(tmp_path):
    """Regression: the hook that broadcasts rank 0's dense variables also broadcast every worker's hash-table
    index, so a resumed worker re-inserted its keys over restored rows and the next checkpoint held keys twice.
    One launch: the uninterrupted run, then 2 steps and a resume to 3, each session in a graph of its own."""
    resumed, uninterrupted = tmp_path / "resumed", tmp_path / "uninterrupted"
    run_workers("hb_mts_hash_resume.py", 2, [uninterrupted, 3, resumed, 2, resumed, 3], timeout=400)
    assert tf.train.latest_checkpoint(str(resumed)) == str(resumed / "model.ckpt-3")
    cc.assert_hash_checkpoints_equal(str(resumed / "model.ckpt-3"), str(uninterrupted / "model.ckpt-3"))


def test_saver_keeps_the_names_a_var_list_dict_gives_sharded_tables(tmp_path):
    """Regression: Saver(var_list={name: var}) saved sharded tables under their variable names instead."""
    values = np.arange(12, dtype=np.float32).reshape(6, 2)
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("table", [6, 2], initializer=tf.compat.v1.constant_initializer(values))
        dense = tf.compat.v1.get_variable("dense", [2], initializer=tf.compat.v1.ones_initializer())
        saver = Saver(var_list={"model/embedding": table, "model/dense": dense})
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            path = saver.save(sess, str(tmp_path / "model.ckpt"))
            sess.run(table.assign(tf.zeros_like(table)))
            saver.restore(sess, path)
            restored = sess.run(table)
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    assert {"model/embedding", "model/dense"} <= set(reader.get_variable_to_shape_map())
    assert "table" not in reader.get_variable_to_shape_map()
    np.testing.assert_array_equal(reader.get_tensor("model/embedding"), values)
    np.testing.assert_array_equal(restored, values)


def test_deltas_of_a_column_wise_table_are_refused_before_anything_is_written(tmp_path):
    """Issue 43: a full checkpoint of a column-wise table is its logical table; a delta of it is refused, naming
    it, when the delta's ops are built (nothing of the delta is written)."""
    values = np.arange(15, dtype=np.float32).reshape(3, 5)
    strategy = CollectiveStrategy("hb", sharding={"wide": "column_wise"})
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("wide", [3, 5], initializer=tf.compat.v1.constant_initializer(values))
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=1)
            with pytest.raises(PlanError, match="table wide: incremental checkpoints .deltas. of a column_wise table "
                                                "are not built yet"):
                saver.save_incremental(sess, str(tmp_path / "model.ckpt"), global_step=2)
    assert strategy.plan["wide"].placement == "column_wise"
    np.testing.assert_array_equal(tf.train.load_variable(path, "wide"), values)
    assert not list(tmp_path.glob("*delta*"))


def test_restore_ops_share_one_loop_whatever_the_number_of_tables(tmp_path):
    """Every sharded table's restore calls one function (per dtype and rank) that reads the stored blocks in a
    loop: a saver of 12 tables holds one loop, not 12 (each loop cost a tenth of a second to build: a DLRM
    saver took seconds). The tables still restore their own rows."""
    strategy = CollectiveStrategy("hb")
    values = [np.full((5 + t, 3), t, np.float32) for t in range(12)]
    with strategy.scope(), tf.Graph().as_default() as graph:
        with strategy.embedding_scope():
            tables = [tf.compat.v1.get_variable(f"table{t}", v.shape, initializer=tf.compat.v1.constant_initializer(v))
                      for t, v in enumerate(values)]
        saver = Saver()
        loops = while_loops(graph)
        assert len(loops) == 1, loops
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            path = saver.save(sess, str(tmp_path / "model.ckpt"))
            sess.run([t.assign(tf.zeros_like(t)) for t in tables])
            saver.restore(sess, path)
            for table, want in zip(tables, values):
                np.testing.assert_array_equal(sess.run(table), want, err_msg=table.op.name)


@pytest.mark.parametrize("vocab, writers", [(4, 3), (5, 3), (3, 2), (8, 8), (9, 8)])
def test_small_tables_restore_their_rows_when_a_stored_block_holds_none_of_them(tmp_path, vocab, writers):
    """Regression: a stored block shorter than the restoring world size (tables of 4 or 5 rows written by 3
    workers, of 3 rows written by 2 and read by 3) failed with "Requires start <= limit" on the ranks owning
    none of its rows."""
    values = np.arange(vocab * 2, dtype=np.float32).reshape(vocab, 2)
    prefix = str(tmp_path / "small")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=["table"], shape_and_slices=[""], tensors=[values])
    splits = block_bounds(vocab, writers)
    for m in sorted({writers, 3}):
        for rank in range(m):
            rows = restore_rows(prefix, "table", splits, [vocab, 2], tf.float32, ShardLayout(rank, m))
            np.testing.assert_array_equal(rows.numpy(), values[rank::m], err_msg=f"rank {rank} of {m}")
            # Table-wise (issue 43): the holder reads every row, the other ranks none.
            rows = restore_rows(prefix, "table", splits, [vocab, 2], tf.float32, TableWiseLayout(rank, m, m - 1))
            np.testing.assert_array_equal(rows.numpy(), values if rank == m - 1 else values[:0],
                                          err_msg=f"table-wise, rank {rank} of {m}")


def _events(directory: pathlib.Path):
    return sorted(directory.glob("events.out.tfevents.*"))


@pytest.mark.parametrize("backend, n, crash", [("hb", 2, "die_in_save:4"), ("sok", 3, "exit_after_step:3")])
def test_monitored_training_session_resumes_after_all_workers_are_killed(tmp_path, reference, backend, n, crash):
    """MTS with checkpoint_dir on every worker; a worker dies; the rerun resumes and ends as an uninterrupted run."""
    model_dir = tmp_path / "model"
    proc = run_workers("checkpoint_mts.py", n, [model_dir, backend, 6, crash], check=False, timeout=400)
    assert proc.returncode == 17, proc.stderr[-4000:]
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-2")
    if crash.startswith("die_in_save"):
        # Rank 1 wrote its part of step 4 and died: the parts are there, the checkpoint and state are not.
        assert (model_dir / "model.ckpt-4_temp" / "part-00001-of-00002.index").exists()
        assert not (model_dir / "model.ckpt-4.index").exists()
    cc.assert_checkpoint_equals(str(model_dir / "model.ckpt-2"), reference.get(2), "before the crash")
    assert len(_events(model_dir)) == 1  # rank 0 alone writes event files

    # The rerun of the sok case saves by time: the workers agree on the steps. Rank 0 would die in the
    # merge of a step-2 checkpoint: the rerun restores step 2 and must not write it again (regression: the
    # save at the start rewrote the restored checkpoint in place, and that crash left it torn).
    every = ["secs"] if backend == "sok" else []
    proc = run_workers("checkpoint_mts.py", n, [model_dir, backend, 6, "die_in_merge:2", *every], timeout=400)
    for r in range(n):
        assert f"[{r}] rank {r} started at step 2" in proc.stdout
    cc.assert_checkpoint_equals(str(model_dir / "model.ckpt-2"), reference[2], "restored, not rewritten")
    cc.assert_checkpoint_equals(str(model_dir / "model.ckpt-6"), reference[6], "resumed")
    assert tf.train.latest_checkpoint(str(model_dir)) == str(model_dir / "model.ckpt-6")
    assert len(_events(model_dir)) == 2 and (model_dir / "graph.pbtxt").exists()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_hash_table_checkpoint_holds_each_key_once_with_its_rows(matrix, n):
    path = str(matrix / "sok-hash" / f"n{n}" / "model.ckpt-2")
    seen = np.unique(np.concatenate([cc.hash_batch(step)[0].ravel() for step in range(2)]))
    assert sorted(cc.read_hash_checkpoint(path)) == sorted(seen.tolist())
    cc.assert_hash_checkpoints_equal(path, str(matrix / "sok-hash" / "n1" / "model.ckpt-2"))


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_hash_table_n_to_m_restore_continues_as_uninterrupted(matrix, n, m):
    cc.assert_hash_checkpoints_equal(str(matrix / "sok-hash" / f"from{n}to{m}" / "model.ckpt-3"),
                                     str(matrix / "sok-hash" / "uninterrupted" / "model.ckpt-3"))


def test_hash_table_chain_across_placements_and_worker_counts_continues_as_uninterrupted(matrix):
    """Row-wise on 2 workers -> table-wise on 3 (the holder alone writes the table and its Adagrad slot) ->
    row-wise on 1, each stage restoring the previous checkpoint and training one step: every checkpoint equals
    the uninterrupted run's, in the same logical format."""
    hashes = matrix / "sok-hash"
    table_wise = str(hashes / "table-wise-2to3" / "model.ckpt-3")
    cc.assert_hash_checkpoints_equal(table_wise, str(hashes / "uninterrupted" / "model.ckpt-3"))
    assert read_plan(table_wise)["item"].placement == "table_wise"
    cc.assert_hash_checkpoints_equal(str(hashes / "chain-to1" / "model.ckpt-4"),
                                     str(hashes / "uninterrupted" / "model.ckpt-4"))


def test_checkpoint_of_another_model_names_the_variable_and_both_shapes(tmp_path):
    """One process (world size 1) writes the model; a model with a larger t1 is refused before restoring."""
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        cc.build(strategy)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(tmp_path / "model.ckpt"), global_step=0)
    message = r"variable 't1' has shape \[30, 4\] in this model but \[23, 4\] in the checkpoint"
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope():
            tf.compat.v1.get_variable("t1", [30, cc.cases.DIM])
        with pytest.raises(CheckpointMismatchError, match=message):
            check_model_dir(tmp_path)
        saver = Saver()
        with tf.compat.v1.Session() as sess, pytest.raises(CheckpointMismatchError, match=message):
            saver.restore(sess, tf.train.latest_checkpoint(str(tmp_path)))


def test_unwritable_model_dir_fails_with_a_clear_error(tmp_path):
    not_a_dir = tmp_path / "a_file"
    not_a_dir.write_text("x")
    with pytest.raises(ModelDirError, match=r"model_dir '.*a_file/model' is not writable"):
        check_model_dir(not_a_dir / "model")
    assert check_model_dir(tmp_path / "fresh") is None and (tmp_path / "fresh").is_dir()


def test_a_save_after_a_killed_save_of_the_same_step_holds_only_its_own_parts(tmp_path):
    """Regression (issue 40, 6): the merge took every part of this world size that existed, so a part left by a
    save killed between writing its parts and merging them was merged into the retry when the retry wrote none of
    that name (a worker holding no key of a hash table): its stale keys were in the checkpoint (with several parts,
    'Duplicate tensor keyed by t'). Each worker now clears its own names first; the retry succeeds at once."""
    from collective.embedding.hash_table import hash_embedding_variable  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb")
    path = str(tmp_path / "model.ckpt")
    with strategy.scope(), tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        with strategy.embedding_scope():
            table = hash_embedding_variable("t", 2, capacity_per_worker=16, initializer=tf.ones_initializer())
        dense = tf.compat.v1.get_variable("w", [2], initializer=tf.ones_initializer())
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * dense)
        train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: [3, 4]})
            parts = f"{path}-1_temp"  # the killed save: its parts written, never merged
            write_parts = saver._write_parts  # pylint: disable=protected-access
            write_parts(sess, parts, f"{parts}/part-00000-of-00001", f"{parts}/replicated")
            assert (tmp_path / "model.ckpt-1_temp" / "part-00000-of-00001-hash0.index").exists()
            sess.run(tf.compat.v1.global_variables_initializer())  # the rerun: no key held yet
            saved = saver.save(sess, path, global_step=1)
            want = sess.run(dense)
    reader = tf.compat.v1.train.NewCheckpointReader(saved)
    assert not reader.has_tensor("t/keys"), reader.get_tensor("t/keys")
    np.testing.assert_array_equal(reader.get_tensor("w"), want)
    assert not (tmp_path / "model.ckpt-1_temp").exists()


# ---------------------------------------------------- variables derived from a table, a user's Saver, export
# 2 workers under TF1 write and export; 3 under TF2 write their own, restore the 2 workers' (N -> M) and export.
DERIVED_LAUNCHES = {2: ("-", "tf1"), 3: (2, "tf2")}


@launch_once
def _derived_launch(base, n):
    source, behaviour = DERIVED_LAUNCHES[n]
    if source != "-":
        _derived_launch(base, source)
        source = tf.train.latest_checkpoint(str(base / f"derived{source}" / "model"))
    out = base / f"derived{n}"
    run_workers("derived_worker.py", n, [out, source, behaviour], timeout=400)
    return out, load_rank_results(out, n)


@pytest.fixture(scope="module")
def derived_reference():
    return dc.reference()


@pytest.fixture(scope="module", params=sorted(DERIVED_LAUNCHES), ids=lambda n: f"{n}workers")
def derived(request, tmp_path_factory):
    return request.param, *_derived_launch(tmp_path_factory.getbasetemp(), request.param)


def test_ema_shadow_and_zeros_like_accumulator_of_a_table_save_as_the_logical_table(derived, derived_reference):
    """Regression: an EMA shadow of a table was broadcast from rank 0 (a checkpoint held rank 0's rows only,
    [3, 2] of a [6, 2] table) and tf.Variable(tf.zeros_like(table)) failed with Mismatched BROADCAST shapes
    when the vocabulary is not divisible by N. Both are the table's rows: the checkpoint holds one process's."""
    _, out, _ = derived
    reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(str(out / "model")))
    for key in dc.KEYS:
        np.testing.assert_allclose(reader.get_tensor(key), derived_reference[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_users_saver_restores_the_ema_weights_into_each_workers_rows(derived, derived_reference):
    """Regression: a tf.compat.v1.train.Saver restoring a logical checkpoint made each worker's shard the whole
    table (lookups of ids 0, 1, 2 read rows [0, 0, 2]). Under scope() it restores each worker's rows, N -> M
    included (3 workers read the 2 workers' checkpoint)."""
    n, _, results = derived
    expected = dc.ema_logits(derived_reference)
    for r in range(n):
        np.testing.assert_allclose(results[r]["ema_logits"], expected, rtol=1e-5, atol=1e-6, err_msg=f"rank {r}")


def test_resumed_ema_shadow_holds_each_workers_rows(derived, derived_reference):
    """Regression: resuming a checkpoint left every worker with rank 0's shadow rows (or failed with "written by a
    different model" on another number of workers); each worker resumes its rows of the logical shadow, N -> M."""
    n, _, results = derived
    shadow = derived_reference["table/ExponentialMovingAverage"]
    for r in range(n):
        np.testing.assert_allclose(results[r]["shadow_rows"], shadow[r::n], rtol=1e-5, atol=1e-6, err_msg=f"rank {r}")


def test_export_serves_what_the_predict_scaffold_saver_restores(derived, derived_reference):
    """Regression: export_estimator ignored the PREDICT spec's scaffold.saver and served the raw weights; plain
    TensorFlow's export serves the EMA weights that saver reads (TF1 behaviour on 2 workers, TF2 on 3)."""
    _, _, results = derived
    exported = str(results[0]["exported"])
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], exported)
        signature = meta.signature_def["serving_default"]
        got = sess.run(signature.outputs["logits"].name, {signature.inputs["ids"].name: dc.SERVE_IDS})
    np.testing.assert_allclose(got, dc.ema_logits(derived_reference), rtol=1e-5, atol=1e-6)


# Issue 43: one checkpoint across placements, worker counts and TF behaviours. Each stage restores the previous
# stage's checkpoint, trains 2 steps and saves. t: row_wise -> table_wise -> column_wise -> row_wise; u the
# other way round (column_wise on 2 workers under both TF behaviours, table_wise on 1).
CHAIN = [(2, "hb", "tf2", "row_wise", "column_wise"), (3, "sok", "tf1", "table_wise", "row_wise"),
         (1, "hb", "tf2", "column_wise", "table_wise"), (2, "sok", "tf1", "row_wise", "column_wise")]


def test_a_checkpoint_moves_across_placements_and_worker_counts_with_its_slots(tmp_path):
    """row_wise@2 -> table_wise@3 (TF1) -> column_wise@1 -> row_wise@2 (TF1), and the other table column_wise@2
    -> row_wise@3 -> table_wise@1 -> column_wise@2: every stage's checkpoint holds the logical tables and slots
    one process holds after as many steps."""
    reference = chain.reference(len(CHAIN))
    previous = "-"
    for stage, (n, backend, mode, t_placement, u_placement) in enumerate(CHAIN):
        prefix = str(tmp_path / f"stage{stage}" / "model.ckpt")
        run_workers("placement_chain.py", n, [str(stage), backend, mode, previous, prefix, t_placement, u_placement])
        for key in chain.KEYS:
            np.testing.assert_allclose(tf.train.load_variable(prefix, key), reference[stage][key], rtol=1e-5,
                                       atol=1e-6, err_msg=f"stage {stage} ({n} workers, {t_placement}/"
                                                          f"{u_placement}, {mode}): {key}")
        assert [manifest.read_plan(prefix)[name].placement for name in ("t", "u")] == [t_placement, u_placement]
        previous = prefix
    # Training moved every variable from its initial value.
    assert not np.allclose(reference[-1]["t"], reference[0]["t"])


# Issue 44: written unpacked on 2 workers, restored into packed tables (t and u: one group variable) on 3 under TF1
# behaviour, and that packed checkpoint restored unpacked on 1 worker.
PACKING_CHAIN = [(2, "tf2", "0"), (3, "tf1", "1"), (1, "tf2", "0")]


def test_a_checkpoint_moves_between_packed_and_unpacked_tables_across_worker_counts(tmp_path):
    """unpacked@2 -> packed@3 (TF1) -> unpacked@1, both tables row-wise under hb: every stage's checkpoint holds
    the logical tables and slots one process holds after as many steps, under the unpacked names."""
    reference = chain.reference(len(PACKING_CHAIN))
    previous = "-"
    for stage, (n, mode, packs) in enumerate(PACKING_CHAIN):
        prefix = str(tmp_path / f"stage{stage}" / "model.ckpt")
        run_workers("placement_chain.py", n, [str(stage), "hb", mode, previous, prefix, "row_wise", "row_wise"],
                    env={"COLLECTIVE_PACKING": packs})
        stored = [name for name, _ in tf.train.list_variables(prefix)]
        assert set(chain.KEYS) <= set(stored) and not [name for name in stored if "packed" in name], stored
        for key in chain.KEYS:
            np.testing.assert_allclose(tf.train.load_variable(prefix, key), reference[stage][key], rtol=1e-5,
                                       atol=1e-6, err_msg=f"stage {stage} ({n} workers, packing {packs}): {key}")
        previous = prefix
