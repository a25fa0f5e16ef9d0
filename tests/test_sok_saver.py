"""sok.Saver (SOK v1): load_embedding_values, dump_to_file, restore_from_file, m_var_name.

One launched job per world size runs tests/workers/sok_saver_worker.py, a SOK
v1 DenseDemo-style program (two All2AllDenseEmbedding tables, one fixed and
one hash, and a DistributedEmbedding) that imports ``sparse_operation_kit``
(resolving to collective.sok), in TF2 (eager + tf.function) and then in TF1
graphs under ``disable_v2_behavior()``. The jobs run on 2, 3 and 1 workers in
that order, each restoring the previous job's dump first: 2 -> 3 and 3 -> 1.
Training from ``load_embedding_values`` is compared with one plain
TensorFlow process on the global batch; dumps are read back with numpy alone.
Bad input is checked in this process (one worker, eager).
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from launcher import run_workers

sys.path.insert(0, str(pathlib.Path(__file__).parent / "workers"))
from workers import sok_saver_cases as cases  # noqa: E402

ORDER = (2, 3, 1)  # each job restores the previous one's dump
PHASES = ("tf2", "tf1")
NAMES = ("a", "b", "c")
VAR_NAMES = ("EmbeddingVariable", "EmbeddingVariable_1", "EmbeddingVariable_2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``n -> output folder`` of the three jobs, launched in ORDER."""
    root = tmp_path_factory.mktemp("sok_saver")
    out, previous = {}, "-"
    for n in ORDER:
        out[n] = root / f"n{n}"
        run_workers("sok_saver_worker.py", n, [out[n], previous], timeout=300)
        previous = out[n]
    return out


@pytest.fixture(scope="module")
def reference():
    return cases.reference_training()


def _load(folder: pathlib.Path, what: str, n: int):
    results = []
    for r in range(n):
        with np.load(folder / f"{what}{r}.npz") as data:
            results.append({k: data[k] for k in data.files})
    return results


def _logical(results, name):
    """The union of the workers' rows of table ``name``: (sorted keys, their vectors); no key held twice."""
    keys = np.concatenate([r[f"{name}_keys"] for r in results])
    vectors = np.concatenate([r[f"{name}_vectors"] for r in results])
    assert np.unique(keys).size == keys.size, f"table {name}: a key is held by two workers"
    order = np.argsort(keys)
    return keys[order], vectors[order]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("n", ORDER)
def test_program_trains_like_one_tensorflow_process_and_dumps_the_logical_table(runs, reference, n, phase):
    losses, tables, dense = reference
    results = _load(runs[n] / phase, "trained", n)
    assert [str(x) for x in results[0]["names"]] == list(VAR_NAMES)
    np.testing.assert_allclose(results[0]["losses"], losses, atol=1e-5)
    for r, res in enumerate(results):
        for i, expected in enumerate(dense):
            np.testing.assert_allclose(res[f"dense{i}"], expected, atol=1e-4, err_msg=f"dense {i} on worker {r}")
    for name, var_name in zip(NAMES, VAR_NAMES):
        keys, vectors = _logical(results, name)
        for r, res in enumerate(results):
            assert np.all(np.mod(res[f"{name}_keys"], n) == r), f"table {name}: worker {r} holds another's key"
        np.testing.assert_array_equal(keys, np.arange(cases.TABLES[name][0]))  # every loaded key, once
        np.testing.assert_allclose(vectors, tables[name], atol=1e-4, err_msg=f"table {name} after training")
        assert np.abs(tables[name] - cases.initial_table(name)).max() > 1e-2, "training did not move the table"
        dumped_keys, dumped = cases.read_dump(runs[n] / phase / "dump", var_name, cases.TABLES[name][1])
        np.testing.assert_array_equal(dumped_keys, keys)
        np.testing.assert_array_equal(dumped, vectors, err_msg=f"dump of table {name} on {n} workers")


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("source,target", [(2, 3), (3, 1)])
def test_dump_from_n_workers_restores_on_m(runs, source, target, phase):
    restored = _load(runs[target] / phase, "restored", target)
    for name, var_name in zip(NAMES, VAR_NAMES):
        dim = cases.TABLES[name][1]
        dumped_keys, dumped = cases.read_dump(runs[source] / phase / "dump", var_name, dim)
        keys, vectors = _logical(restored, name)
        np.testing.assert_array_equal(keys, dumped_keys)
        np.testing.assert_array_equal(vectors, dumped, err_msg=f"table {name} restored {source} -> {target}")
        for r, res in enumerate(restored):
            assert np.all(np.mod(res[f"{name}_keys"], target) == r)
            # A lookup through the layer after the restore reads the dumped vectors.
            batch = cases.local_batch(0, r, target)
            if name == "c":
                keys_c = batch["c"]
                expected = np.stack([dumped[row[row >= 0]].sum(axis=0) for row in keys_c]).reshape(
                    -1, cases.TABLES["c"][2], dim)
                np.testing.assert_allclose(res["c_lookup"], expected, rtol=1e-6, atol=1e-6)
            else:
                np.testing.assert_array_equal(res[f"{name}_lookup"], dumped[batch[name]])


def test_graph_restore_without_a_dump_names_the_variable_and_file(runs):
    message = str(_load(runs[1] / "tf1", "trained", 1)[0]["missing_error"])
    assert "sok.Saver.restore_from_file(EmbeddingVariable)" in message
    assert "no_dump_here/EmbeddingVariable_keys.file does not exist" in message


# ---------------------------------------------------------------- one worker, eager: forms and bad input

def _layer(sok, rows=8, dim=4, hashed=False):
    return sok.All2AllDenseEmbedding(rows, dim, slot_num=1, nnz_per_slot=1, use_hashtable=hashed)


def test_load_forms_partial_tables_and_hash_tables():
    import collective.sok as sok

    saver = sok.Saver()
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    whole, parts, partial = _layer(sok), _layer(sok), _layer(sok)
    before = partial.embedding_variable.numpy()  # built by reading it, before any call
    assert whole.m_var_name != parts.m_var_name and whole.embedding_variable.m_var_name == whole.m_var_name
    assert saver.load_embedding_values(whole.embedding_variable, table).numpy() == b"OK"
    saver.load_embedding_values(parts.embedding_variable, [table[:3], tf.constant(table[3:5]), table[5:]])
    saver.load_embedding_values(partial.embedding_variable, tf.constant(table[:5]))
    np.testing.assert_array_equal(whole.embedding_variable.numpy(), table)
    np.testing.assert_array_equal(parts.embedding_variable.numpy(), table)
    np.testing.assert_array_equal(partial.embedding_variable.numpy()[:5], table[:5])
    np.testing.assert_array_equal(partial.embedding_variable.numpy()[5:], before[5:])
    hashed = _layer(sok, rows=16, hashed=True)
    hashed(tf.constant([[[40]]], tf.int64))  # a key not in the loaded table: loading forgets it
    saver.load_embedding_values(hashed.embedding_variable, table)
    assert int(hashed.hash_size) == 8
    np.testing.assert_array_equal(hashed(tf.constant([[[6]], [[40]]], tf.int64), training=False).numpy()[:, 0, 0],
                                  np.stack([table[6], np.zeros(4, np.float32)]))


def test_bad_input_names_the_variable_and_file(tmp_path):
    import collective.sok as sok

    saver = sok.Saver()
    layer = _layer(sok)
    var, name = layer.embedding_variable, layer.m_var_name
    with pytest.raises(ValueError, match=f"load_embedding_values\\({name}\\): tensors have 5 columns.*is 4"):
        saver.load_embedding_values(var, np.zeros([8, 5], np.float32))
    with pytest.raises(ValueError, match=f"{name}.*9 rows for a table of 8"):
        saver.load_embedding_values(var, [np.zeros([5, 4]), np.zeros([4, 4])])
    with pytest.raises(ValueError, match=f"{name}.*must be 2-D"):
        saver.load_embedding_values(var, np.zeros([8], np.float32))
    with pytest.raises(TypeError, match="not the embedding variable of a SOK layer"):
        saver.dump_to_file(tf.Variable(np.zeros([8, 4], np.float32)), str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"restore_from_file\\({name}\\): .*{name}_keys.file does not exist"):
        saver.restore_from_file(var, str(tmp_path / "empty"))

    wide = _layer(sok, dim=6)
    saver.dump_to_file(wide.embedding_variable, str(tmp_path / "wide"))
    for suffix in ("_keys.file", "_values.file"):  # the dump of a dim-6 table under this table's name
        (tmp_path / "wide" / f"{wide.m_var_name}{suffix}").rename(tmp_path / "wide" / f"{name}{suffix}")
    with pytest.raises(ValueError, match=f"{name}.*holds 8 keys.*12 rows of embedding_vec_size=4.*6 values per key"):
        saver.restore_from_file(var, str(tmp_path / "wide"))

    big = _layer(sok, rows=12)
    saver.load_embedding_values(big.embedding_variable, np.ones([12, 4], np.float32))
    saver.dump_to_file(big.embedding_variable, str(tmp_path / "big"))
    for suffix in ("_keys.file", "_values.file"):
        (tmp_path / "big" / f"{big.m_var_name}{suffix}").rename(tmp_path / "big" / f"{name}{suffix}")
    with pytest.raises(ValueError, match=f"{name}.*key 8, outside this table's rows \\[0, 8\\).*raise"):
        saver.restore_from_file(var, str(tmp_path / "big"))

    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OSError, match=f"could not write the dump of {name}"):
        saver.dump_to_file(var, str(tmp_path / "file"))


def test_sok_uint32_key_files_restore_into_int32_keyed_layers_and_repeated_keys_are_refused(tmp_path):
    import collective.sok as sok

    saver = sok.Saver()
    layer = sok.All2AllDenseEmbedding(8, 2, slot_num=1, nnz_per_slot=1, use_hashtable=False, key_dtype=tf.int32)
    keys, values = np.array([5, 1], "<u4"), np.array([[1, 2], [3, 4]], "<f4")
    keys.tofile(tmp_path / f"{layer.m_var_name}_keys.file")
    values.tofile(tmp_path / f"{layer.m_var_name}_values.file")
    saver.restore_from_file(layer.embedding_variable, str(tmp_path))
    np.testing.assert_array_equal(layer.embedding_variable.numpy()[[5, 1]], values)
    np.array([3, 3], "<i8").tofile(tmp_path / f"{layer.m_var_name}_keys.file")
    with pytest.raises(ValueError, match=f"{layer.m_var_name}_keys.file repeats keys"):
        saver.restore_from_file(layer.embedding_variable, str(tmp_path))


def test_a_whole_sok_load_leaves_no_state_of_the_keys_held_before(tmp_path):
    """Regression (issue 40, 3): sok.load of a whole dump into a DynamicVariable that held keys emptied only its
    index: the freed rows kept the old keys' optimizer slots, and a new key inherited them (its Adagrad accumulator
    5.1 instead of 1.1 here). Now every row's values, slots and update marks are reset (eagerly and in a graph)."""
    import collective.sok as sok
    from collective.embedding.table import shard_of

    sok.init()

    def run(tag, graph):
        table = sok.DynamicVariable(dimension=2, initializer=0.1, var_type="hbm", key_type=tf.int64,
                                    init_capacity=16, name=f"fresh_{tag}")
        make = tf.keras.optimizers.Adagrad if not graph else tf.compat.v1.train.AdagradOptimizer
        opt = sok.OptimizerWrapper(make(0.5, initial_accumulator_value=0.1))
        keys = tf.compat.v1.placeholder(tf.int64, [None]) if graph else None

        def step(ids):
            if graph:  # d loss / d row = 1 for each looked-up row: the accumulator grows by 1 a step
                loss = tf.reduce_sum(sok.lookup_sparse([table], [tf.RaggedTensor.from_row_lengths(
                    ids, tf.shape(ids, out_type=tf.int64))], combiners=["sum"])[0])
                return opt.apply_gradients(zip(tf.gradients(loss, [table]), [table]))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(sok.lookup_sparse([table], [tf.ragged.constant([ids], tf.int64)],
                                                       combiners=["sum"])[0])
            return opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

        def accumulators():
            held, rows = shard_of(table).hash_index.entries()
            slot = list(opt.slots(table).values())[0]
            return dict(zip(held.numpy().tolist(), tf.gather(slot, rows)[:, 0].numpy().tolist()))

        path = str(tmp_path / tag)
        if graph:
            train = step(keys)
            dump, load = sok.dump(path, [table], opt), sok.load(path, [table], opt)
            index = shard_of(table).hash_index
            held, rows = index.entries()
            read = (held, tf.gather(list(opt.slots(table).values())[0], rows)[:, 0])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train, {keys: [1, 2]})
                sess.run(dump)
                for _ in range(4):
                    sess.run(train, {keys: [3, 4, 5]})
                sess.run(load)
                sess.run(train, {keys: [20]})
                return dict(zip(*[v.tolist() for v in sess.run(read)]))
        step([1, 2])
        sok.dump(path, [table], opt)
        for _ in range(4):
            step([3, 4, 5])
        sok.load(path, [table], opt)
        step([20])
        return accumulators()

    want = {1: 1.1, 2: 1.1, 20: 1.1}  # 0.1 + one step's 1 each: key 20 starts afresh
    got = run("eager", False)
    with tf.Graph().as_default():
        got_graph = run("graph", True)
    for tag, found in (("eager", got), ("graph", got_graph)):
        assert sorted(found) == sorted(want), (tag, found)
        np.testing.assert_allclose([found[k] for k in sorted(want)], [want[k] for k in sorted(want)], rtol=1e-6,
                                   err_msg=tag)
