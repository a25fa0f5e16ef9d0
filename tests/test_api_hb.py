"""collective.hb (HybridBackend's API): optimizer wrappers, scopes, context, options, recipes.

Multi-process cases run through the launcher on 1, 2 and 3 workers and are
compared with one plain TensorFlow process training on the whole global batch.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from launcher import RECIPES, load_rank_results, run_workers
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).parent / "workers"))
from workers import api_hb_cases as hbc  # noqa: E402
from workers import embedding_cases as cases

WORKERS = [1, 2, 3]


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"{n}workers")
def hb_run(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"hb-{n}")
    run_workers("api_hb_worker.py", n, [out], timeout=900)
    return n, load_rank_results(out, n)


@pytest.fixture(scope="module")
def reference():
    batches = [cases.global_batch(step) for step in range(cases.STEPS)]
    runs = {name: hbc.train(lambda: getattr(tf.compat.v1.train, name)(**kwargs), batches)
            for name, kwargs in hbc.OPTIMIZERS.items()}
    runs["user"] = hbc.train(lambda: hbc.PlainSGD(0.5), batches)
    return runs


def _check(res, n, prefix, expected):
    losses, (table, w) = expected
    np.testing.assert_allclose(np.mean([res[r][f"{prefix}_losses"] for r in range(n)], axis=0), losses, rtol=1e-5)
    for r in range(n):
        np.testing.assert_allclose(res[r][f"{prefix}_table"], table[r::n], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(res[r][f"{prefix}_w"], w, rtol=1e-4, atol=1e-6)
    assert not np.allclose(table, cases.table_values(1)), "training did not move the table"


@pytest.mark.parametrize("name", list(hbc.OPTIMIZERS))
def test_wrapped_optimizer_trains_like_one_process(hb_run, reference, name):
    n, res = hb_run
    _check(res, n, name, reference[name])


@pytest.mark.parametrize("name", ["AdagradOptimizer", "FtrlOptimizer"])
def test_wrapper_inside_scope_does_not_average_twice(hb_run, reference, name):
    n, res = hb_run
    _check(res, n, f"scoped_{name}", reference[name])


def test_wraps_optimizer_on_a_user_class(hb_run, reference):
    n, res = hb_run
    _check(res, n, "user", reference["user"])


def test_wrapped_user_apply_gradients_calling_super_inside_scope_averages_once(hb_run, reference):
    n, res = hb_run
    _check(res, n, "override", reference["user"])


def test_every_tf_train_optimizer_has_a_wrapper():
    import collective.hb as hb

    expected = {name for name, value in vars(tf.compat.v1.train).items()
                if isinstance(value, type) and issubclass(value, tf.compat.v1.train.Optimizer)}
    expected -= {"Optimizer", "SyncReplicasOptimizer"}
    assert set(hb.train.OPTIMIZERS) == expected
    for name in expected:
        wrapped = getattr(hb.train, name)
        assert issubclass(wrapped, getattr(tf.compat.v1.train, name)) and wrapped.__name__ == name
    with pytest.raises(AttributeError, match="SyncReplicasOptimizer is not provided.*AdamOptimizer"):
        getattr(hb.train, "SyncReplicasOptimizer")
    with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
        hb.train.wraps_optimizer(tf.keras.optimizers.SGD)


def test_global_norm_clip_outside_the_scope_is_refused_and_inside_it_applies():
    """HybridBackend's recipe builds the update outside ``hb.scope()``; TensorFlow's own global norm there sums
    this worker's slices of a table's gradient, so workers would clip apart (issue 42): refused when built."""
    import collective.hb as hb

    for inside in (False, True):
        with tf.Graph().as_default():
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
            with hb.scope(), hb.embedding_scope():
                table = tf.compat.v1.get_variable("t", [7, 3])
                loss = tf.reduce_mean(tf.square(tf.nn.embedding_lookup(table, ids)))
            optimizer = hb.train.AdagradOptimizer(0.1)
            with hb.scope() if inside else contextlib.nullcontext():
                pairs = optimizer.compute_gradients(loss)
                grads, _ = tf.clip_by_global_norm([g for g, _ in pairs], 0.5)
                if inside:
                    optimizer.apply_gradients(zip(grads, [v for _, v in pairs]))
                    continue
                with pytest.raises(ValueError, match=r"clip_by_global_norm .*outside the strategy's scope\(\) over "
                                                     r"the gradient of the table 't.*under .*hb.scope\(\)"):
                    optimizer.apply_gradients(zip(grads, [v for _, v in pairs]))


def test_clip_by_norm_in_the_scope_clips_a_table_gradient_as_tensorflow_and_carries_the_clipped_norm():
    """``tf.clip_by_norm`` in the scope clips a table's gradient by one process's norm (Keras' ``clipnorm``; issue
    42; on 2 and 3 workers: test_programs ``keras-legacy-clipnorm-*``): in one process TensorFlow's clip, and a
    global norm of the clipped gradient is the clipped norm, not the norm it had (in-process, one worker)."""
    import collective.hb as hb

    with tf.Graph().as_default():
        ids = tf.constant([[0, 1], [1, 5]], tf.int64)
        with hb.scope(), hb.embedding_scope():
            table = tf.compat.v1.get_variable("t", initializer=tf.reshape(tf.range(21, dtype=tf.float32), [7, 3]))
            loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids)))
        with hb.scope():
            [(grad, _)] = hb.train.GradientDescentOptimizer(0.1).compute_gradients(loss, [table])
            clipped = tf.clip_by_norm(grad, 0.5)
            norm = tf.linalg.global_norm([clipped])
        plain = tf.clip_by_norm(grad, 0.5)  # outside the scope: TensorFlow's own
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            ours, theirs, clipped_norm = sess.run([clipped.values, plain.values, norm])
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    np.testing.assert_allclose(clipped_norm, 0.5, rtol=1e-6)


def test_keras_clipvalue_over_a_table_gradient_is_refused_naming_the_table():
    """Keras' ``clipvalue`` clips a table's gradient slice by slice, and a worker's slices are cut apart from one
    process's (2 workers: 0.2% apart at step 3; issue 42): refused when ``apply_gradients`` is built, naming the
    table; the same optimizer over a dense variable alone is built (in-process, one worker)."""
    import collective.hb as hb

    with tf.Graph().as_default():
        ids = tf.constant([[0, 1], [1, 5]], tf.int64)
        with hb.scope():
            with hb.embedding_scope():
                table = tf.compat.v1.get_variable("clipped_table", [7, 3])
            dense = tf.compat.v1.get_variable("dense", [3, 1])
            out = tf.matmul(tf.reduce_sum(tf.nn.embedding_lookup(table, ids), 1), dense)
            loss = tf.reduce_mean(tf.square(out))
            optimizer = tf.keras.optimizers.legacy.SGD(0.1, clipvalue=0.01)
            with pytest.raises(ValueError, match="clipvalue=0.01 would clip the gradient of the table 'clipped_table"):
                optimizer.apply_gradients(zip(tf.gradients(loss, [table, dense]), [table, dense]))
            assert optimizer.apply_gradients([(tf.gradients(loss, [dense])[0], dense)]) is not None


def test_context_and_tuning_options(monkeypatch):
    import collective.hb as hb
    from collective import context

    monkeypatch.setenv("HB_COMM_DEFAULT", "gloo")
    monkeypatch.setenv("HB_COMM_POOL_CAPACITY", "4")
    context.reset()
    try:
        assert (hb.context.rank, hb.context.world_size) == (0, 1)
        assert hb.context.options.comm_default == "GLOO"
        assert hb.context.options.comm_pool_capacity == 4
        monkeypatch.setenv("HB_COMM_DEFAULT", "carrier-pigeon")
        context.reset()
        with pytest.raises(context.OptionError, match="HB_COMM_DEFAULT='CARRIER-PIGEON' is not one of NCCL, GLOO"):
            hb.context.options.comm_default  # pylint: disable=pointless-statement
    finally:
        monkeypatch.delenv("HB_COMM_DEFAULT")
        monkeypatch.delenv("HB_COMM_POOL_CAPACITY")
        context.reset()


def test_unknown_arguments_are_named():
    import collective.hb as hb

    with pytest.raises(TypeError, match="emb_device"):
        with hb.scope(emb_device="/cpu:0"):
            pass
    with pytest.raises(TypeError, match="server_def"):
        hb.train.Server(server_def=None)
    assert hb.train.Server().target == ""
    assert hb.train.device_setter() in ("/cpu:0", "/gpu:0")


def _write_parquet(directory, files=6, rows=8):
    """``files`` Parquet files of ``rows`` rows, each one row group (as pandas and Spark write them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    paths = []
    for f in range(files):
        table = pa.table({"a": rng.normal(0, 1, rows), "c": rng.integers(0, 20, rows),
                          "label": rng.integers(0, 2, rows).astype(np.float32)})
        path = directory / f"part{f}.parquet"
        pq.write_table(table, path)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("layout", [(6, 8), (1, 48)], ids=["6files", "1file-1rowgroup"])
@pytest.mark.parametrize("n", [2, 3])
def test_monitored_training_session_recipe_trains_like_one_process(tmp_path, n, layout):
    # One file of one row group used to leave every worker but one without data (OutOfRangeError).
    files = _write_parquet(tmp_path, *layout)
    out = tmp_path / "out"
    out.mkdir()
    run_workers(str(RECIPES / "hb_mts.py"), n, [out, *files], timeout=900)
    res = load_rank_results(out, n)
    steps = len(res[0]["losses"])
    assert steps == 48 // (4 * n) and all(len(res[r]["losses"]) == steps for r in range(n))
    # Every row read exactly once over the workers.
    read = sorted(float(x) for r in range(n) for s in range(steps) for x in res[r][f"a{s}"])
    import pyarrow.parquet as pq
    assert read == sorted(float(x) for f in files for x in pq.read_table(f)["a"].to_numpy())
    # One process replaying the global batches (all workers' batches of a step) with TensorFlow's optimizer.
    losses, final_table, final_w, rng_table = _replay(res, n, steps, tf.compat.v1.train.GradientDescentOptimizer(0.5))
    np.testing.assert_allclose(np.mean([res[r]["losses"] for r in range(n)], axis=0), losses, rtol=1e-5)
    for r in range(n):
        with np.load(out / f"final{r}.npz") as final:
            np.testing.assert_allclose(final["table"], final_table[r::n], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(final["w"], final_w, rtol=1e-5, atol=1e-6)
    assert not np.allclose(final_table, rng_table)
    _check_export(out, final_table, final_w)


def _check_export(out, table, w):
    """The recipe's SavedModel (written by rank 0) serves the trained model in plain TensorFlow."""
    exports = list((out / "export").iterdir())
    assert len(exports) == 1, exports
    rng = np.random.default_rng(9)
    a, c = rng.normal(0, 1, 5).astype(np.float32), rng.integers(0, 20, 5)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "a": tf.train.Feature(float_list=tf.train.FloatList(value=[x])),
        "c": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))})).SerializeToString() for x, y in zip(a, c)]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.load(sess, ["serve"], str(exports[0]))
        signature = meta.signature_def["serving_default"]
        logits = sess.run(signature.outputs["logits"].name, {"input:0": examples})
    expected = np.concatenate([table[c], a[:, None]], axis=1) @ w
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


def _replay(res, n, steps, optimizer):
    """One process training the recipes' model on each step's global batch; returns losses, table, w, and
    a function computing logits of (a, c) with the final values."""
    with tf.Graph().as_default():
        feats = {k: tf.compat.v1.placeholder(dt, [None]) for k, dt in
                 (("a", tf.float64), ("c", tf.int64), ("label", tf.float32))}
        rng_table = np.random.default_rng(3).normal(0, 0.5, (20, 4)).astype(np.float32)
        table = tf.compat.v1.get_variable("c_table", initializer=rng_table)
        w = tf.compat.v1.get_variable("w", initializer=np.linspace(-0.5, 0.5, 5).reshape(-1, 1).astype(np.float32))
        x = tf.concat([tf.nn.embedding_lookup(table, feats["c"]), tf.cast(feats["a"], tf.float32)[:, None]], 1)
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(tf.reshape(feats["label"], [-1, 1]), tf.matmul(x, w))
        train = optimizer.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = []
            for s in range(steps):
                feed = {feats[k]: np.concatenate([np.ravel(res[r][f"{k}{s}"]) for r in range(n)]) for k in feats}
                losses.append(sess.run([loss, train], feed)[0])
            final_table, final_w = sess.run([table, w])
    return losses, final_table, final_w, rng_table


@pytest.mark.parametrize("n", [2, 3])
def test_estimator_recipe_trains_evaluates_and_exports_like_one_process(tmp_path, n):
    files = _write_parquet(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    run_workers(str(RECIPES / "hb_estimator.py"), n, [out, *files], timeout=900)
    res = load_rank_results(out, n)
    steps = int(res[0]["steps"])
    assert steps == 48 // (4 * n) and all(int(res[r]["steps"]) == steps for r in range(n))
    # model_dir=None: worker 0's temporary folder, the same on every worker.
    model_dir = str(res[0]["model_dir"])
    assert "collective_model_" in model_dir and all(str(res[r]["model_dir"]) == model_dir for r in range(n))
    losses, table, w, initial = _replay(res, n, steps, tf.compat.v1.train.AdagradOptimizer(0.5))
    assert not np.allclose(table, initial), "training did not move the table"
    for r in range(n):
        np.testing.assert_allclose(res[r]["table"], table, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res[r]["w"], w, rtol=1e-5, atol=1e-6)
    # Parallel evaluation: every worker reports the metrics of all rows.
    import pyarrow.parquet as pq

    data = [pq.read_table(f).to_pydict() for f in files]
    a = np.concatenate([d["a"] for d in data]).astype(np.float32)
    c = np.concatenate([d["c"] for d in data])
    label = np.concatenate([d["label"] for d in data]).astype(np.float32)
    logits = (np.concatenate([table[c], a[:, None]], axis=1) @ w)[:, 0]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        expected_loss = sess.run(tf.compat.v1.losses.sigmoid_cross_entropy(label, logits))
        auc, update = tf.compat.v1.metrics.auc(label, tf.sigmoid(logits))
        sess.run(tf.compat.v1.local_variables_initializer())
        sess.run(update)
        expected_auc = sess.run(auc)
    for r in range(n):
        np.testing.assert_allclose(res[r]["eval_loss"], expected_loss, rtol=1e-5)
        np.testing.assert_allclose(res[r]["eval_auc"], expected_auc, rtol=1e-5)
    # The SavedModel (rank 0 writes it) serves the trained model from its sparse and dense placeholders.
    exports = list((out / "export").iterdir())
    assert len(exports) == 1, exports
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.load(sess, ["serve"], str(exports[0]))
        signature = meta.signature_def["serving_default"]
        sparse = signature.inputs["c"].coo_sparse
        served = sess.run(signature.outputs["logits"].name, {
            signature.inputs["a"].name: a[:7], sparse.indices_tensor_name: np.array([[i, 0] for i in range(7)]),
            sparse.values_tensor_name: c[:7], sparse.dense_shape_tensor_name: np.array([7, 1])})
    np.testing.assert_allclose(served[:, 0], logits[:7], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def uneven_mts(tmp_path_factory):
    """hb_uneven_mts.py on 2 workers: 10 batches on rank 0, 7 on rank 1."""
    out = tmp_path_factory.mktemp("hb-uneven")
    run_workers("hb_uneven_mts.py", 2, [out])
    return load_rank_results(out, 2)


def test_unequal_shares_end_together_under_monitored_training_session(uneven_mts):
    """Regression: with 10 batches on rank 0 and 7 on rank 1, rank 1 left after 7 steps and rank 0 died.

    Now every rank runs 10 steps; a rank without data contributes zero gradients, so each step trains like
    one process on the mean of the per-worker losses, with an empty worker's loss taken as 0."""
    from workers import uneven_cases as cases  # pylint: disable=import-outside-toplevel

    res = uneven_mts
    data = [cases.worker_data(r) for r in range(2)]
    with tf.Graph().as_default():
        parts = []
        for r in range(2):
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            with tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
                loss, table, w = cases.model(ids, y)
            parts.append((ids, y, loss))
        opt = tf.compat.v1.train.GradientDescentOptimizer(cases.LR)
        both = opt.minimize((parts[0][2] + parts[1][2]) / 2)
        alone = opt.minimize(parts[0][2] / 2)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(cases.batch_count(0)):
                rows = slice(step * cases.BATCH, (step + 1) * cases.BATCH)
                feed = {parts[0][0]: data[0][0][rows], parts[0][1]: data[0][1][rows]}
                if step < cases.batch_count(1):
                    feed.update({parts[1][0]: data[1][0][rows], parts[1][1]: data[1][1][rows]})
                sess.run(both if step < cases.batch_count(1) else alone, feed)
            expected_table, expected_w = sess.run([table, w])
    for r in range(2):
        assert int(res[r]["steps"]) == cases.batch_count(0)
        np.testing.assert_allclose(res[r]["table"], expected_table[r::2], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res[r]["w"], expected_w, rtol=1e-5, atol=1e-6)


def test_batch_norm_on_the_empty_batches_of_unequal_shares_gives_no_nan(uneven_mts):
    """Regression: rank 1's empty batches gave it NaN moving statistics and every rank NaN Keras gamma.

    Now rank 1's moving statistics are what its own 7 batches give, and the weights are finite and equal."""
    from workers import estimator_cases, uneven_cases  # pylint: disable=import-outside-toplevel

    res = uneven_mts
    for r in range(2):
        assert int(res[r]["bn/steps"]) == uneven_cases.batch_count(0)
        for key, value in res[r].items():
            if key.startswith("bn/"):
                assert np.isfinite(value).all(), (r, key, value)
        ids = uneven_cases.worker_data(r)[0].astype(np.float32)
        batches = [ids[lo:lo + uneven_cases.BATCH] for lo in range(0, len(ids), uneven_cases.BATCH)]
        for name, value in estimator_cases.reference_moving_statistics(batches).items():
            np.testing.assert_allclose(res[r][f"bn/{name}"], value, rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {name}")
        for key in ("bn/bn_fused/gamma", "bn/bn_keras/gamma", "bn/bn_fused/beta", "bn/bn_keras/beta"):
            np.testing.assert_array_equal(res[r][key], res[0][key])
