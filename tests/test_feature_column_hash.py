"""``collective.hash_embedding_column.categorical_column_with_embedding`` through ``input_layer``:
sharded on 1, 2 and 3 workers with both backends, trained, and in export mode."""

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.embedding import modes
from collective import hash_embedding_column as cfc
from collective.embedding import hash_table, key_init
from workers import hash_cases as cases

MOVIE_TABLE = "embedding/input_layer/movie_embedding/embedding_weights"
WORD_TABLE = "embedding/input_layer_1/word_embedding/embedding_weights"


@pytest.fixture(scope="module", params=[(b, n) for b in ("hb", "sok") for n in (1, 2, 3)],
                ids=lambda p: f"{p[0]}-{p[1]}workers")
def hash_run(request, tmp_path_factory):
    backend, n = request.param
    return backend, n, cases.run(tmp_path_factory.getbasetemp(), backend, n)


def _combined(keys_per_row, salt, combiner):
    out = np.zeros((len(keys_per_row), cases.DIM), np.float64)
    for row, keys in enumerate(keys_per_row):
        if len(keys):
            vectors = cases.init_vectors(np.array(keys, np.int64), salt).astype(np.float64)
            out[row] = vectors.sum(0) / (len(keys) if combiner == "mean" else 1.0)
    return out


def test_int_and_string_columns_equal_reference(hash_run):
    _, n, res = hash_run
    for r in range(n):
        assert sorted(res[r]["fc_tables"].tolist()) == sorted([MOVIE_TABLE, WORD_TABLE])
        dense, (rows, keys, _), _ = cases.local_batch(0, r, n)
        # embedding_column's safe lookup drops negative keys, as for every TensorFlow categorical column.
        movie_keys = [[k for k in keys[rows == row] if k >= 0] for row in range(len(dense))]
        np.testing.assert_allclose(res[r]["fc_movie"],
                                   _combined(movie_keys, key_init.salt_of(None, MOVIE_TABLE), "mean"),
                                   rtol=1e-5, atol=1e-6)
        words = cases.words(dense)
        hashed = tf.strings.to_hash_bucket_fast(words, cfc.STRING_KEY_BUCKETS).numpy()
        word_keys = [[h for h, w in zip(hashed[row], words[row]) if w] for row in range(len(dense))]
        np.testing.assert_allclose(res[r]["fc_word"], _combined(word_keys, key_init.salt_of(None, WORD_TABLE), "sum"),
                                   rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- single process

def _movie_column(capacity=cases.CAPACITY):
    return tf.feature_column.embedding_column(
        cfc.categorical_column_with_embedding(
            "movie", dtype=tf.int64, ev_option=cfc.EmbeddingVariableOption(capacity_per_worker=capacity)),
        dimension=cases.DIM, initializer=tf.random_uniform_initializer(cases.MINVAL, cases.MAXVAL))


BATCHES = [([[5, 9], [9, -1], [2 ** 62, 5]]), ([[7, 5], [2 ** 62, 9], [7, 7]])]


def test_estimator_example_trains_like_plain_tensorflow():
    """The reference Estimator example's column and Adagrad, against a plain table of the same keys."""
    strategy = CollectiveStrategy("hb")
    labels = np.array([[1.0], [0.0], [1.0]], np.float32)
    with strategy.scope(), tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        with strategy.embedding_scope():
            with tf.compat.v1.variable_scope("embedding", partitioner=tf.compat.v1.fixed_size_partitioner(1)):
                emb = tf.compat.v1.feature_column.input_layer({"movie": ids}, [_movie_column()])
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.multiply(emb, 2.0)))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
        table = tf.compat.v1.get_collection(hash_table.HASH_TABLES_COLLECTION)[0]
        held = table.entries()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            losses = [sess.run([loss, train_op], {ids: batch})[0] for batch in BATCHES]
            keys, rows = sess.run(held)
            trained = dict(zip(keys.tolist(), sess.run(table.values)[rows]))

    known = np.unique([k for batch in BATCHES for row in batch for k in row if k >= 0])
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        plain = tf.compat.v1.get_variable("plain", initializer=cases.init_vectors(known, key_init.salt_of(
            None, MOVIE_TABLE)))
        sparse = tf.sparse.from_dense(ids + 1)  # keeps -1 (missing) out, like the column's dense input
        sparse = tf.SparseTensor(sparse.indices, tf.searchsorted(known, sparse.values - 1), sparse.dense_shape)
        emb = tf.nn.safe_embedding_lookup_sparse(plain, sparse, combiner="mean")
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, tf.multiply(emb, 2.0)))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            expected_losses = [sess.run([loss, train_op], {ids: batch})[0] for batch in BATCHES]
            expected = dict(zip(known.tolist(), sess.run(plain)))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    assert sorted(trained) == sorted(expected)
    for key, vector in trained.items():
        np.testing.assert_allclose(vector, expected[key], rtol=1e-5, atol=1e-7)


def test_export_mode_builds_a_plain_lookup():
    """Export: key -> row tf.lookup table + [rows, dim] variable; unseen keys read zeros, as in inference."""
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    with tf.Graph().as_default() as graph, modes.exporting({MOVIE_TABLE: 3}):
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        with tf.compat.v1.variable_scope("embedding", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
            emb = tf.compat.v1.feature_column.input_layer({"movie": ids}, [_movie_column()])
        [(name, index)] = tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES)
        [var] = [v for v in tf.compat.v1.global_variables() if v.op.name == MOVIE_TABLE]
        assert name == MOVIE_TABLE and var.shape.as_list() == [None, 4]  # a serving update may add rows
        assert not [op.type for op in graph.get_operations() if "Horovod" in op.type]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(var).shape == (3, 4)
            sess.run([index.insert(tf.constant([10, 20, 30], tf.int64), tf.constant([0, 1, 2], tf.int64)),
                      var.assign(values)])
            got = sess.run(emb, {ids: [[10, 30], [20, 99], [-1, -1]]})
    np.testing.assert_allclose(got, [(values[0] + values[2]) / 2, values[1] / 2, np.zeros(4)])


def test_column_outside_strategy_scope_fails_clearly():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"column 'movie'.*must be built inside CollectiveStrategy.scope\(\)"):
            tf.compat.v1.feature_column.input_layer({"movie": tf.constant([[1, 2]], tf.int64)}, [_movie_column()])


def test_unsupported_ev_options_fail_clearly():
    with pytest.raises(NotImplementedError, match="storage_option"):
        cfc.EmbeddingVariableOption(storage_option=object())
    with pytest.raises(TypeError, match="filter_option.*CounterFilter"):
        cfc.EmbeddingVariableOption(filter_option=object())
    with pytest.raises(TypeError, match="evict_option.*GlobalStepEvict"):
        cfc.EmbeddingVariableOption(evict_option=cfc.CounterFilter(2))
    with pytest.raises(ValueError, match="dtype must be an integer type or tf.string"):
        cfc.categorical_column_with_embedding("price", dtype=tf.float32)


def test_deeprec_options_map_onto_one_policy():
    VocabularyPolicy = hash_table.VocabularyPolicy  # noqa: N806

    assert cfc.EmbeddingVariableOption().policy is None
    option = cfc.EmbeddingVariableOption(
        filter_option=cfc.CounterFilter(filter_freq=3), evict_option=cfc.GlobalStepEvict(steps_to_live=100),
        init_option=cfc.InitializerOption(default_value_no_permission=0.5), evict_every_steps=10)
    assert option.policy == VocabularyPolicy(min_count=3, steps_to_live=100, default_value=0.5, evict_every_steps=10)
    cbf = cfc.EmbeddingVariableOption(filter_option=cfc.CBFFilter(filter_freq=2, max_element_size=2 ** 20,
                                                                  false_positive_probability=0.01),
                                      evict_option=cfc.L2WeightEvict(l2_weight_threshold=0.1))
    # DeepRec evicts when it saves a checkpoint: the default without evict_every_steps.
    assert cbf.policy == VocabularyPolicy(min_count=2, l2_weight_threshold=0.1, evict_at_checkpoint=True,
                                          evict_every_steps=None)
    both = cfc.EmbeddingVariableOption(evict_option=cfc.GlobalStepEvict(5), evict_every_steps=7,
                                       evict_at_checkpoint=True)
    assert both.policy == VocabularyPolicy(steps_to_live=5, evict_every_steps=7, evict_at_checkpoint=True)
    assert cfc.EmbeddingVariableOption(evict_option=cfc.L2WeightEvict()).policy is None  # DeepRec's -1: off


def test_column_with_policy_builds_a_policy_table_and_exports_its_default():
    """The column's table carries the policy; its export form serves keys it does not hold the default value."""
    option = cfc.EmbeddingVariableOption(capacity_per_worker=16, filter_option=cfc.CounterFilter(2),
                                         init_option=cfc.InitializerOption(default_value_no_permission=0.5))
    column = tf.feature_column.embedding_column(
        cfc.categorical_column_with_embedding("movie", dtype=tf.int64, ev_option=option), 4, combiner="sum")
    strategy = CollectiveStrategy("hb")
    with strategy.scope(), tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with strategy.embedding_scope(), tf.compat.v1.variable_scope("embedding"):
            out = tf.compat.v1.feature_column.input_layer({"movie": tf.constant([[10, 30]], tf.int64)}, [column])
        [table] = tf.compat.v1.get_collection(hash_table.HASH_TABLES_COLLECTION)
        assert table.policy.min_count == 2
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            np.testing.assert_array_equal(sess.run(out), [[1.0] * 4])  # seen once: not admitted, 2 x 0.5
    with tf.Graph().as_default(), modes.exporting({MOVIE_TABLE: 1}), tf.compat.v1.variable_scope("embedding"):
        emb = tf.compat.v1.feature_column.input_layer({"movie": tf.constant([[10, 30]], tf.int64)}, [column])
        [(_, index)] = tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES)
        [var] = [v for v in tf.compat.v1.global_variables() if v.op.name == MOVIE_TABLE]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run([index.insert(tf.constant([10], tf.int64), tf.constant([0], tf.int64)), var.assign([[1.0] * 4])])
            np.testing.assert_array_equal(sess.run(emb), [[1.5] * 4])


def test_column_with_initial_capacity_grows_and_trains_like_one_allocated_at_capacity():
    """``EmbeddingVariableOption(initial_capacity_per_worker=2)``: the column's table starts with 2 rows, grows
    as keys arrive, and trains bit for bit what the same column allocated at its capacity trains."""

    def train(initial):
        option = cfc.EmbeddingVariableOption(capacity_per_worker=64, initial_capacity_per_worker=initial)
        column = tf.feature_column.embedding_column(
            cfc.categorical_column_with_embedding("movie", dtype=tf.int64, ev_option=option), 4, combiner="mean")
        strategy = CollectiveStrategy("hb")
        with strategy.scope(), tf.Graph().as_default():
            step = tf.compat.v1.train.get_or_create_global_step()
            keys = tf.compat.v1.placeholder(tf.int64, [None, 2])
            with strategy.embedding_scope(), tf.compat.v1.variable_scope("embedding"):
                out = tf.compat.v1.feature_column.input_layer({"movie": keys}, [column])
            train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(tf.reduce_sum(tf.square(out - 1.0)),
                                                                         global_step=step)
            [table] = tf.compat.v1.get_collection(hash_table.HASH_TABLES_COLLECTION)
            held, rows = table.entries()
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for i in range(4):
                    sess.run(train_op, {keys: np.arange(6 * i, 6 * i + 8).reshape(4, 2)})
                return sess.run([held, tf.gather(table.values, rows), tf.shape(table.values)[0]])

    grown, allocated = train(2), train(None)
    for a, b in zip(grown[:2], allocated[:2]):
        np.testing.assert_array_equal(a, b)
    assert len(grown[0]) == 26 and grown[2] == 32 and allocated[2] == 64
