"""Hash-table vocabularies: the index against the numpy reference, first vectors, and sharded
lookups and training on 1, 2 and 3 workers with both backends (through the launcher)."""

import numpy as np
import pytest
import tensorflow as tf

from collective.embedding import hash_table, key_init
from collective.kernels import reference
from graphs import while_loops
from workers import hash_cases as cases

BACKENDS = ["hb", "sok"]
WORKERS = [1, 2, 3]


# ---------------------------------------------------------------- the index, single process

def _batches():
    rng = np.random.default_rng(5)
    special = np.array([0, -1, cases.INT64_MAX, cases.INT64_MIN], np.int64)
    for size in (7, 9, 6):
        batch = rng.integers(-50, 50, size) * 1_000_003
        yield np.concatenate([batch, batch[:2], special[rng.integers(0, 4, 2)]]).astype(np.int64)


def test_index_rows_equal_reference_table():
    ref = reference.HashTable(24, load_factor=1.0)  # 32 slots: many collisions
    with tf.Graph().as_default():
        index = hash_table.HashTable("idx", 2, 24, load_factor=1.0)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        rows, found, entries = index.find_or_insert(keys), index.find(keys), index.entries()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(rows, {keys: np.zeros(0, np.int64)}).shape == (0,)  # an empty batch
            for batch in _batches():
                np.testing.assert_array_equal(sess.run(rows, {keys: batch}), ref.insert_or_find(batch))
            probe = np.array([cases.INT64_MIN, 5, 0, cases.INT64_MAX, 12 * 1_000_003, -3], np.int64)
            np.testing.assert_array_equal(sess.run(found, {keys: probe}), ref.find(probe))
            for got, want in zip(sess.run(entries), ref.export()):
                np.testing.assert_array_equal(got, want)
            sess.run(index.clear())
            assert sess.run(index.size()) == 0
            np.testing.assert_array_equal(sess.run(found, {keys: probe}), -np.ones(6))
            np.testing.assert_array_equal(sess.run(rows, {keys: probe[::-1]}), np.arange(6))


def test_inserts_in_one_step_are_ordered():
    """Several find_or_insert in one session.run see each other's keys, INT64_MIN's slot included."""
    batches = list(_batches())
    ref = reference.HashTable(24, load_factor=1.0)
    expected = [ref.insert_or_find(batch) for batch in batches]
    with tf.Graph().as_default():
        index = hash_table.HashTable("idx", 2, 24, load_factor=1.0)
        rows = [index.find_or_insert(tf.constant(batch)) for batch in batches]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for got, want in zip(sess.run(rows), expected):
                np.testing.assert_array_equal(got, want)
            assert sess.run(index.size()) == ref.size


def test_full_index_fails_naming_table_and_stays_unchanged():
    with tf.Graph().as_default():
        index = hash_table.HashTable("scope/my_table", 2, 3)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        rows = index.find_or_insert(keys)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(rows, {keys: [10, 11, 10]})
            full = r"hash table scope/my_table is full.*capacity_per_worker=3.*Raise the capacity of the table"
            with pytest.raises(tf.errors.InvalidArgumentError, match=full):
                sess.run(rows, {keys: [12, 13, 11]})
            assert sess.run(index.size()) == 2
            np.testing.assert_array_equal(sess.run(index.find(tf.constant([10, 11, 12, 13], tf.int64))),
                                          [0, 1, -1, -1])


def test_home_slots_equal_reference():
    keys = np.array([0, 1, -1, cases.INT64_MAX, cases.INT64_MIN, 123456789, -987654321], np.int64)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        np.testing.assert_array_equal(sess.run(hash_table.home_slots(tf.constant(keys), 64)),
                                      reference.hash_slots(keys, 64))


def test_estimator_modes_pick_the_lookup_mode():
    for mode, training in (("train", True), ("eval", False), ("infer", False)):
        with hash_table.for_mode(mode):
            assert hash_table.is_training() is training
    assert hash_table.is_training()


def test_export_form_serves_keys_through_the_exchange():
    """Export mode: a [rows, dim] variable + key -> row lookup table; unseen keys read zeros, nothing inserted."""
    from collective.embedding import modes  # pylint: disable=import-outside-toplevel
    from collective.embedding import lookup as sharded  # pylint: disable=import-outside-toplevel
    from collective.embedding.table import shard_of  # pylint: disable=import-outside-toplevel

    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    with tf.Graph().as_default(), modes.exporting({"sok/items": 2}):
        with tf.compat.v1.variable_scope("sok"):
            var = hash_table.hash_embedding_variable("items", 4, capacity_per_worker=10)
        [(name, index)] = tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES)
        assert name == "sok/items" and var.shape.as_list() == [None, 4]  # a serving update may add rows
        keys = tf.constant([[cases.INT64_MIN, 7], [3, cases.INT64_MIN]], tf.int64)
        dense = sharded.lookup(var, shard_of(var), keys, "sok")
        pooled = sharded.lookup_sparse(var, shard_of(var), tf.constant([7, 3, 3], tf.int64), tf.constant([0, 0, 1]),
                                       None, "mean", "sok")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(var).shape == (2, 4)
            sess.run([index.insert(tf.constant([cases.INT64_MIN, 7], tf.int64), tf.constant([0, 1], tf.int64)),
                      var.assign(values)])
            got_dense, got_pooled = sess.run([dense, pooled])
    np.testing.assert_array_equal(got_dense, [[values[0], values[1]], [np.zeros(4), values[0]]])
    np.testing.assert_array_equal(got_pooled, [values[1] / 2, np.zeros(4)])


@pytest.mark.parametrize("lookup", ["v1", "v2", "embedding_column"])
def test_safe_lookup_leaves_empty_rows_out_of_the_vocabulary(lookup):
    """Regression: TensorFlow fills empty rows with id 0 before the lookup, which inserted key 0."""
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective import hash_embedding_column

    strategy = CollectiveStrategy("hb")
    # Sample 1 is empty, sample 2 holds only a negative key (pruned, as TensorFlow does): both give zeros.
    with strategy.scope(), tf.Graph().as_default():
        sp_ids = tf.SparseTensor([[0, 0], [0, 1], [2, 0], [3, 0]], tf.constant([7, 9, -4, 5], tf.int64), [4, 2])
        if lookup == "embedding_column":
            column = tf.feature_column.embedding_column(
                hash_embedding_column.categorical_column_with_embedding("item", dtype=tf.int64), 4,
                combiner="sum", initializer=tf.compat.v1.random_uniform_initializer(-1, 1, seed=1))
            with strategy.embedding_scope():
                out = tf.compat.v1.feature_column.input_layer({"item": sp_ids}, [column])
            var = [v for v in tf.compat.v1.global_variables() if hash_table.table_of(v) is not None][0]
        else:
            with tf.compat.v1.variable_scope("sok"):
                var = hash_table.hash_embedding_variable("items", 4, capacity_per_worker=10)
            v1, v2 = tf.compat.v1.nn.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse
            out = (v1 if lookup == "v1" else v2)(var, sp_ids, combiner="sum")
        keys, _ = hash_table.table_of(var).entries()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            got = sess.run(out)
            held = sorted(sess.run(keys).tolist())
            values = dict(zip(held, sess.run(tf.nn.embedding_lookup(var, tf.constant(held, tf.int64)))))
    assert held == [5, 7, 9]
    np.testing.assert_allclose(got, [values[7] + values[9], np.zeros(4), np.zeros(4), values[5]], rtol=1e-6)


def test_sok_hash_layer_builds_in_an_export_graph():
    """Regression: a SOK hash-table layer built for export raised "'ExportedTable' has no attribute 'variables'"."""
    from collective import sok  # pylint: disable=import-outside-toplevel
    from collective.embedding import modes

    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    with tf.Graph().as_default(), modes.exporting({"items/embedding_variables": 2}):
        layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=10, embedding_vec_size=4, slot_num=1,
                                          nnz_per_slot=1, use_hashtable=True, name="items")
        vectors = layer(tf.constant([[[7]], [[3]]], tf.int64), training=False)
        [(name, index)] = tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES)
        assert name == "items/embedding_variables" and not hasattr(layer, "hash_keys")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run([index.insert(tf.constant([7], tf.int64), tf.constant([1], tf.int64)),
                      layer.embedding_variable.assign(values)])
            got = sess.run(vectors)
    np.testing.assert_array_equal(got.reshape(2, 4), [values[1], np.zeros(4)])



def test_probe_loops_are_built_once_whatever_the_number_of_tables():
    """Every index's find and insert call two shared probe functions: a graph of 12 tables' training and
    inference lookups holds two loops, not 24 or 36 (each loop cost a tenth of a second to build). Each index
    still keeps its own keys."""
    batches = [np.array([t, 7 * t + 1, t, -t - 2], np.int64) for t in range(12)]
    with tf.Graph().as_default() as graph:
        indexes = [hash_table.HashTable(f"idx{t}", 2, 8) for t in range(12)]
        rows = [index.find_or_insert(tf.constant(b)) for index, b in zip(indexes, batches)]
        with tf.control_dependencies(rows):
            found = [index.find(tf.constant(b[::-1])) for index, b in zip(indexes, batches)]
        loops = while_loops(graph)
        assert len(loops) == 2, loops
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got_rows, got_found = sess.run([rows, found])
    for batch, r, f in zip(batches, got_rows, got_found):
        ref = reference.HashTable(8)
        want = ref.insert_or_find(batch)
        np.testing.assert_array_equal(r, want)
        np.testing.assert_array_equal(f, want[::-1])

def test_table_wise_is_refused_where_it_is_not_built_naming_the_table():
    """A policy or growth on a table-wise hash table, and SOK's own hash tables, are refused before any variable
    is made, naming the table."""
    from collective import CollectiveStrategy, sok  # pylint: disable=import-outside-toplevel
    from collective.sharding import PlanError  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb", sharding={"t": "table_wise", "g": "table_wise", "d": "table_wise"})
    with strategy.scope(), tf.Graph().as_default():
        with pytest.raises(PlanError, match="hash table 't': placement 'table_wise' is not built for a table with a "
                                            "vocabulary policy"):
            hash_table.hash_embedding_variable("t", 4, 10, min_count=2)
        with pytest.raises(PlanError, match="hash table 'g': placement 'table_wise' is not built for a table with "
                                            "growth"):
            hash_table.hash_embedding_variable("g", 4, 16, initial_capacity_per_worker=4)
        with pytest.raises(PlanError, match="table 'd': placement 'table_wise' is not built for a SOK table yet"):
            sok.DynamicVariable(4, name="d")
        assert not tf.compat.v1.global_variables()


# ---------------------------------------------------------------- first vectors

def _first_vectors(initializer, keys, dim=4, capacity=100, name="t"):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        return sess.run(key_init.KeyInitializer(initializer, name, dim, capacity, tf.float32)(tf.constant(keys)))


def test_uniform_first_vectors_equal_numpy_twin():
    keys = np.array([3, -3, cases.INT64_MAX, cases.INT64_MIN, 0], np.int64)
    got = _first_vectors(tf.compat.v1.random_uniform_initializer(cases.MINVAL, cases.MAXVAL, seed=11), keys)
    np.testing.assert_array_equal(got, cases.init_vectors(keys, 11))
    # Without a seed the table's name salts the draw: two tables start differently.
    a = _first_vectors(tf.random_uniform_initializer(cases.MINVAL, cases.MAXVAL), keys, name="a")
    np.testing.assert_array_equal(a, cases.init_vectors(keys, key_init.salt_of(None, "a")))
    assert not np.allclose(a, _first_vectors(tf.random_uniform_initializer(cases.MINVAL, cases.MAXVAL), keys,
                                             name="b"))


def test_first_vectors_follow_the_initializer_distribution():
    keys = np.arange(-20000, 20000, dtype=np.int64)
    normal = _first_vectors(tf.compat.v1.truncated_normal_initializer(1.0, 0.5), keys)
    assert normal.min() >= 0.0 and normal.max() <= 2.0
    assert abs(normal.mean() - 1.0) < 0.01 and 0.42 < normal.std() < 0.46  # 0.88 * 0.5 after truncation
    glorot = _first_vectors(tf.compat.v1.glorot_uniform_initializer(), keys, dim=8, capacity=92)
    assert np.abs(glorot).max() <= np.sqrt(6.0 / 100) and np.abs(glorot).max() > 0.9 * np.sqrt(6.0 / 100)
    np.testing.assert_array_equal(_first_vectors(tf.compat.v1.constant_initializer(0.25), keys[:3]),
                                  np.full((3, 4), 0.25, np.float32))
    np.testing.assert_array_equal(_first_vectors(tf.zeros_initializer(), keys[:3]), np.zeros((3, 4)))


def test_unsupported_initializer_names_table():
    with pytest.raises(TypeError, match="hash table 'movies'.*cannot give each key its own first vector"):
        _first_vectors(tf.compat.v1.orthogonal_initializer(), np.arange(3, dtype=np.int64), name="movies")


# ---------------------------------------------------------------- sharded, through the launcher

@pytest.fixture(scope="module", params=[(b, n) for b in BACKENDS for n in WORKERS],
                ids=lambda p: f"{p[0]}-{p[1]}workers")
def hash_run(request, tmp_path_factory):
    backend, n = request.param
    return backend, n, cases.run(tmp_path_factory.getbasetemp(), backend, n)


@pytest.fixture(scope="module")
def reference_training():
    return {name: cases.reference_training(name) for name in cases.OPTIMIZERS}


def combine(vectors, rows, weights, batch, combiner):
    out = np.zeros((batch, vectors.shape[1]), np.float64)
    for row in range(batch):
        sel = rows == row
        w = weights[sel].astype(np.float64)
        norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w ** 2).sum())}[combiner]
        out[row] = (vectors[sel] * w[:, None]).sum(0) / norm if sel.any() else 0.0
    return out


def test_dense_lookups_equal_numpy(hash_run):
    _, n, res = hash_run
    salt = cases.SEEDS["lookup"]
    for r in range(n):
        dense, _, _ = cases.local_batch(0, r, n)
        np.testing.assert_array_equal(res[r]["dense"], cases.init_vectors(dense, salt).reshape(dense.shape + (-1,)))
        small = dense % 2001 - 1000
        np.testing.assert_array_equal(res[r]["dense_int32"],
                                      cases.init_vectors(small, salt).reshape(dense.shape + (-1,)))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sparse_lookups_equal_numpy(hash_run, combiner):
    _, n, res = hash_run
    for r in range(n):
        dense, (rows, keys, weights), _ = cases.local_batch(0, r, n)
        vectors = cases.init_vectors(keys, cases.SEEDS["lookup"])
        np.testing.assert_allclose(res[r][f"sparse_{combiner}"],
                                   combine(vectors, rows, np.ones_like(weights), len(dense), combiner), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(res[r][f"weighted_{combiner}"],
                                   combine(vectors, rows, weights, len(dense), combiner), rtol=1e-5, atol=1e-6)


def test_each_key_lives_on_its_owner_once(hash_run):
    _, n, res = hash_run
    looked_up = set()
    for r in range(n):
        dense, (_, keys, _), _ = cases.local_batch(0, r, n)
        looked_up |= set(dense.ravel().tolist()) | set((dense % 2001 - 1000).ravel().tolist()) | set(keys.tolist())
    held = []
    for r in range(n):
        keys, rows = res[r]["lookup_keys"], res[r]["lookup_rows"]
        assert all(k % n == r for k in keys.tolist()), f"rank {r} holds keys it does not own"
        np.testing.assert_array_equal(rows, np.arange(len(rows)))
        assert res[r]["size_after_training_lookups"] == len(rows)
        held += keys.tolist()
    assert sorted(held) == sorted(looked_up)


def test_inference_lookups_do_not_insert(hash_run):
    _, n, res = hash_run
    for r in range(n):
        dense, _, _ = cases.local_batch(0, r, n)
        assert res[r]["size_after_inference"] == res[r]["size_after_training_lookups"]
        expected = np.concatenate([cases.init_vectors(dense[:, 0], cases.SEEDS["lookup"]), np.zeros((2, cases.DIM))])
        np.testing.assert_array_equal(res[r]["inference"], expected)


@pytest.mark.parametrize("optimizer", cases.OPTIMIZERS)
def test_training_equals_single_process(hash_run, reference_training, optimizer):
    """Row-wise (key k on rank k % N), or table-wise in the launch's run of ``cases.TABLE_WISE``: training equals
    one process and every key is held once, on its owner."""
    _, n, res = hash_run
    losses, tables, (w, b) = reference_training[optimizer]
    np.testing.assert_allclose(np.mean([res[r][f"{optimizer}_losses"] for r in range(n)], axis=0), losses,
                               rtol=1e-5)
    for r in range(n):
        np.testing.assert_allclose(res[r][f"{optimizer}_w"], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res[r][f"{optimizer}_b"], b, rtol=1e-5, atol=1e-6)
    holders = res[0].get(f"{optimizer}_holders")
    for t, (table, reference_vectors) in enumerate(tables.items()):
        held = {}
        for r in range(n):
            keys, vectors = res[r][f"{optimizer}_{table}_keys"], res[r][f"{optimizer}_{table}_vectors"]
            for key, vector in zip(keys.tolist(), vectors):
                owner = key % n if holders is None else holders[t]
                assert owner == r and key not in held, (table, key, r)
                held[key] = vector
        assert sorted(held) == sorted(reference_vectors)
        for key, vector in held.items():
            np.testing.assert_allclose(vector, reference_vectors[key], rtol=1e-5, atol=1e-6, err_msg=f"key {key}")


def test_table_wise_training_equals_single_process(hash_run, reference_training):
    """``sharding={"t1": "table_wise", "t2": "table_wise"}`` in one optimizer's run of each launch (Adagrad or
    Adam: slots; each backend and N meets both): each table whole, index and slots, on its holder (t1 on rank
    0, t2 on rank 1), the other ranks holding no key, and training equals one process
    (:func:`test_training_equals_single_process` compares the values)."""
    backend, n, res = hash_run
    optimizer = cases.TABLE_WISE[(backend, n)]
    _, tables, _ = reference_training[optimizer]
    holders = [0, 1 % n]
    for r in range(n):
        assert res[r][f"{optimizer}_holders"].tolist() == holders
        for table, holder in zip(tables, holders):
            want = sorted(tables[table]) if r == holder else []
            assert sorted(res[r][f"{optimizer}_{table}_keys"].tolist()) == want, (table, r)
    test_training_equals_single_process(hash_run, reference_training, optimizer)


def test_full_table_error_names_table(hash_run):
    _, n, res = hash_run
    for r in range(n):
        message = str(res[r]["capacity_error"])
        assert "hash table tiny_table is full" in message and "capacity_per_worker=2" in message, message
        assert "Raise the capacity of the table" in message
