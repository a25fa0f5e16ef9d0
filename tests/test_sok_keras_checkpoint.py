"""Keras checkpoints of SOK tables hold the logical table and restore under another world size.

Two launches of tests/workers/sok_keras_checkpoint_worker.py: on 2 workers a
model with every kind of SOK table (v1 fixed and hash ``All2AllDenseEmbedding``,
hash ``DistributedEmbedding``, v2 ``sok.Variable`` and ``sok.DynamicVariable``)
trains and saves with ``tf.train.Checkpoint`` and (one step later)
``model.save_weights``; on 3 workers a trained model reads the first and an
unbuilt one loads the second. The reference is the union of the saving
workers' rows (numpy), which plain TensorFlow must also read from the files.
The tables train with Adam (Keras) and Adagrad (legacy Keras) and the
checkpoint holds both optimizers: their slots restore as logical rows too,
and a third model on 3 workers that reads the checkpoint before anything
exists and trains one step matches the 2-worker run's next step.
In this process (one worker): the errors of a restore into a smaller or
narrower table, and the refusal of a slot not shaped like its table.
"""
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from launcher import launch_once, load_rank_results, run_workers

TABLES = ("fixed", "hashed", "pooled", "var", "dyn")
HASHED = ("hashed", "pooled", "dyn")
FIXED_PER_WORKER = 6  # as in the worker: 12 logical rows on 2 workers, 18 on 3
STAGES = {"ckpt": "ckpt", "weights": "weights"}  # stage -> checkpoint prefix in the checkpoint folder
SLOTS = {"fixed": ("momentums", "velocities"), "hashed": ("momentums", "velocities"),
         "pooled": ("momentums", "velocities"), "var": ("accumulator",), "dyn": ("accumulator",)}
INITIAL_SLOT = {"momentums": 0.0, "velocities": 0.0, "accumulator": 0.1}  # Adam's; legacy Adagrad's default


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("sok_keras_checkpoint")


@launch_once
def _runs(base):
    """(saving workers' results, restoring workers' results), 2 -> 3."""
    ckpt = base / "checkpoints"
    run_workers("sok_keras_checkpoint_worker.py", 2, ["save", base / "n2", ckpt], timeout=300)
    run_workers("sok_keras_checkpoint_worker.py", 3, ["restore", base / "n3", ckpt], timeout=300)
    return load_rank_results(base / "n2", 2), load_rank_results(base / "n3", 3)


def _logical(ranks, stage, name, field="vectors"):
    """``(sorted keys, their vectors)`` over every worker's rows; each worker holds only keys it owns.

    ``field``: ``vectors`` (the table) or ``slot_<slot>`` (an optimizer slot's rows).
    """
    n = len(ranks)
    keys, vectors = [], []
    for r, res in enumerate(ranks):
        held = res[f"{stage}_{name}_keys"]
        assert np.all(np.mod(held, n) == r), f"{stage}/{name}: worker {r} of {n} holds a key it does not own"
        keys.append(held)
        vectors.append(res[f"{stage}_{name}_{field}"])
    keys, vectors = np.concatenate(keys), np.concatenate(vectors)
    assert np.unique(keys).size == keys.size, f"{stage}/{name}: a key is held twice"
    order = np.argsort(keys)
    return keys[order], vectors[order]


def _stored(prefix: str, name: str):
    """``(keys, vectors)`` of table ``name`` as plain TensorFlow reads them from the checkpoint."""
    def table_of(key):  # tf.train.Checkpoint(model=...) keys start with "model/", save_weights keys do not
        parts = key.split("/")
        return parts[1] if parts[0] == "model" else parts[0]

    keys_key = [k for k, _ in tf.train.list_variables(prefix)
                if table_of(k) == name and k.endswith("/.ATTRIBUTES/keys") and ".OPTIMIZER_SLOT" not in k]
    assert len(keys_key) == 1, (name, tf.train.list_variables(prefix))
    values_key = keys_key[0][:-len("keys")] + "VARIABLE_VALUE"
    return tf.train.load_variable(prefix, keys_key[0]), tf.train.load_variable(prefix, values_key)


@pytest.mark.parametrize("stage", STAGES)
def test_checkpoint_holds_the_logical_table(base, stage):
    saved, _ = _runs(base)
    prefix = str(base / "checkpoints" / STAGES[stage])
    for name in TABLES:
        keys, vectors = _logical(saved, stage, name)
        stored_keys, stored = _stored(prefix, name)
        np.testing.assert_array_equal(stored_keys, keys, err_msg=f"{stage}/{name}: keys")
        np.testing.assert_array_equal(stored, vectors, err_msg=f"{stage}/{name}: vectors")
    assert np.abs(_logical(saved, "ckpt", "fixed")[1] - _logical(saved, "weights", "fixed")[1]).max() > 1e-3, \
        "the step between the two saves did not move the tables"
    # Workers 1.. saved to sok.checkpoint_path(prefix), elsewhere: the folder holds worker 0's files only.
    names = sorted(p.name for p in (base / "checkpoints").iterdir())
    assert names == ["checkpoint", "ckpt.data-00000-of-00001", "ckpt.index", "weights.data-00000-of-00001",
                     "weights.index"], names


@pytest.mark.parametrize("stage", STAGES)
def test_saved_on_2_workers_restores_on_3(base, stage):
    saved, restored = _runs(base)
    for name in TABLES:
        keys, vectors = _logical(saved, stage, name)
        got_keys, got = _logical(restored, stage, name)
        if name in HASHED:  # key by key: exactly the saved keys, nothing the model held before
            np.testing.assert_array_equal(got_keys, keys, err_msg=f"{stage}/{name}: keys")
            np.testing.assert_array_equal(got, vectors, err_msg=f"{stage}/{name}: vectors")
            continue
        np.testing.assert_array_equal(got[:len(keys)], vectors, err_msg=f"{stage}/{name}: saved rows")
        if name == "fixed":  # 18 rows on 3 workers: the 6 the checkpoint lacks keep their values
            assert len(got_keys) == 3 * FIXED_PER_WORKER and len(keys) == 2 * FIXED_PER_WORKER
            if stage == "ckpt":
                before_keys, before = _logical(restored, "before", name)
                np.testing.assert_array_equal(got[len(keys):], before[len(keys):])
                assert np.abs(before[:len(keys)] - vectors).max() > 1e-3, "the restore changed nothing"
        else:
            assert len(got_keys) == len(keys)
    for r, res in enumerate(restored):
        np.testing.assert_array_equal(res[f"{stage}_dense"], saved[0][f"{stage}_dense"], err_msg=f"dense on {r}")


@pytest.mark.parametrize("stage", STAGES)
def test_lookups_after_the_restore_read_the_saved_vectors(base, stage):
    saved, restored = _runs(base)
    tables = {name: dict(zip(*(a.tolist() for a in _logical(saved, stage, name)))) for name in TABLES}
    batch = {name: saved[0][f"batch_{name}"] for name in TABLES}

    def rows(name, keys):
        return np.array([tables[name][int(k)] for k in keys.reshape(-1)], np.float32).reshape(keys.shape + (-1,))

    expected = {"fixed": rows("fixed", batch["fixed"]), "hashed": rows("hashed", batch["hashed"]),
                "pooled": rows("pooled", batch["pooled"]).sum(axis=1)[:, None],
                "var": rows("var", batch["var"]).sum(axis=1), "dyn": rows("dyn", batch["dyn"]).sum(axis=1)}
    for r, res in enumerate(restored):
        for name in TABLES:
            np.testing.assert_allclose(res[f"{stage}_{name}_lookup"], expected[name], rtol=1e-6, atol=1e-6,
                                       err_msg=f"{stage}/{name} on worker {r}")


def test_optimizer_slots_restore_as_logical_rows_on_3_workers(base):
    saved, restored = _runs(base)
    for name, slots in SLOTS.items():
        for slot in slots:
            field, what = f"slot_{slot}", f"{name}/{slot}"
            keys, rows = _logical(saved, "ckpt", name, field)
            got_keys, got = _logical(restored, "ckpt", name, field)
            assert np.abs(rows - INITIAL_SLOT[slot]).max() > 1e-6, f"{what}: training left the slot as it started"
            if name in HASHED:  # key by key; every row no key holds starts again as a new slot
                np.testing.assert_array_equal(got_keys, keys, err_msg=what)
                np.testing.assert_array_equal(got, rows, err_msg=what)
                for r, res in enumerate(restored):
                    free = res[f"ckpt_{name}_{field}_free"]
                    assert set(free.tolist()) <= {np.float32(INITIAL_SLOT[slot])}, f"{what}: free rows on {r}: {free}"
                continue
            np.testing.assert_array_equal(got[:len(keys)], rows, err_msg=what)
            _, before = _logical(restored, "before", name, field)
            np.testing.assert_array_equal(got[len(keys):], before[len(keys):], err_msg=f"{what}: rows not saved")
            assert np.abs(before[:len(keys)] - rows).max() > 1e-6, f"{what}: the restore changed nothing"


def test_a_step_after_a_deferred_restore_on_3_workers_continues_the_2_worker_run(base):
    """Checkpoint read before model and optimizers exist, one step: the 2-worker run's next step (``weights``)."""
    saved, restored = _runs(base)
    for name, slots in SLOTS.items():
        for field in ("vectors",) + tuple(f"slot_{slot}" for slot in slots):
            keys, expected = _logical(saved, "weights", name, field)
            got_keys, got = _logical(restored, "resumed", name, field)
            np.testing.assert_array_equal(got_keys[:len(keys)], keys, err_msg=f"{name}/{field}: keys")
            np.testing.assert_allclose(got[:len(keys)], expected, rtol=1e-5, atol=1e-6, err_msg=f"{name}/{field}")
    for r, res in enumerate(restored):
        np.testing.assert_allclose(res["resumed_dense"], saved[0]["weights_dense"], rtol=1e-5, atol=1e-6,
                                   err_msg=f"dense on {r}")


# ---------------------------------------------------------------- one worker: what a restore refuses

def test_restore_into_a_smaller_or_narrower_table_names_it(tmp_path):
    import collective.sok as sok

    assert sok.checkpoint_path(str(tmp_path / "x")) == str(tmp_path / "x")  # worker 0 saves where it is told
    big = sok.All2AllDenseEmbedding(12, 4, slot_num=1, nnz_per_slot=1, use_hashtable=False, name="big")
    path = tf.train.Checkpoint(table=big.embedding_variable).write(str(tmp_path / "big"))
    small = sok.All2AllDenseEmbedding(8, 4, slot_num=1, nnz_per_slot=1, use_hashtable=False, name="small")
    with pytest.raises(ValueError, match="small/embedding_variables.*rows at or beyond this table's 8 rows.*raise"):
        tf.train.Checkpoint(table=small.embedding_variable).read(path)
    narrow = sok.All2AllDenseEmbedding(16, 2, slot_num=1, nnz_per_slot=1, use_hashtable=True, name="narrow")
    narrow(tf.constant([[[3]]], tf.int64))
    with pytest.raises(ValueError, match="narrow/embedding_variables.*4 columns, this table 2"):
        tf.train.Checkpoint(table=narrow.embedding_variable).read(path)


def test_a_slot_not_shaped_like_its_table_is_refused_at_save(tmp_path):
    import collective.sok as sok

    table = sok.Variable(np.ones([10, 2], np.float32), name="factored")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adafactor(0.1))  # factored moments: [10] and [2]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([table], [tf.ragged.constant([[1, 3]], tf.int64)])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    with pytest.raises(ValueError, match=r"slot .*\(Adafactor\) of SOK table factored is shaped \(10,\).*Leave the "
                                         "Adafactor out of the checkpoint"):
        tf.train.Checkpoint(table=table, optimizer=opt.optimizer).write(str(tmp_path / "refused"))
    tf.train.Checkpoint(table=table).write(str(tmp_path / "table_only"))  # without the optimizer it saves
