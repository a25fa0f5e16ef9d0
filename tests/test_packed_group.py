"""One physical variable per packing group (docs/packing.md, stage 2 prototype, design B) in one process.

The same model is trained 3 steps with three unpacked tables and with the tables packed into one group
variable (``collective.embedding.packed_group``), each gradient clipped by its norm (packed: the group
gradient split per table, clipped, merged back); the tables, the optimizer's slots, the global norm of the
first gradients and the checkpoint's names and values (an ``ExponentialMovingAverage`` shadow's included)
must equal the unpacked run's, with one sparse apply
for the group instead of one per table. ``tf.compat.v1.train.AdagradOptimizer`` and the legacy Keras
``Adagrad``, under TF2 behaviour here and TF1 behaviour (``disable_v2_behavior``; ref variables for the
unpacked model under the v1 optimizer) in one subprocess.
"""

import collections
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from collective.embedding.packed_group import PackedGroup

BATCH, DIM, STEPS = 6, 4, 3
CLIP = 1.0  # per-gradient tf.clip_by_norm: per table unpacked, per table of the split group gradient packed
TABLES = (("a", 7), ("b", 9), ("c", 5))
OPTIMIZERS = ("v1_adagrad", "keras_legacy_adagrad")


def _optimizer(kind: str):
    if kind == "v1_adagrad":
        return tf.compat.v1.train.AdagradOptimizer(0.3)
    return tf.keras.optimizers.legacy.Adagrad(0.3)


def _train(packed: bool, kind: str, directory: str) -> dict:
    """Trains the model; returns the tables, slots, first global norm, sparse applies and the checkpoint's content."""
    rng = np.random.default_rng(5)
    initial = [(name, rng.normal(size=(rows, DIM)).astype(np.float32)) for name, rows in TABLES]
    ids = [rng.integers(0, rows, (STEPS, BATCH, 3)) for _, rows in TABLES]
    for table_ids, (_, rows) in zip(ids, TABLES):
        table_ids[:, 0, :2] = rows - 1  # a repeated id in every step
    labels = rng.normal(size=(STEPS, BATCH, 1)).astype(np.float32)
    # Under TF1 behaviour get_variable makes ref variables, which the legacy Keras optimizers cannot make slots for
    # (plain TensorFlow: "dtype float32_ref for Tensor with dtype float32"); tables are resource variables anyway.
    use_resource = None if kind == "v1_adagrad" else True
    with tf.Graph().as_default() as graph, tf.compat.v1.variable_scope("", use_resource=use_resource):
        step = tf.compat.v1.placeholder(tf.int32, [])
        dense = tf.compat.v1.get_variable("dense", initializer=rng.normal(size=(len(TABLES) * DIM, 1))
                                          .astype(np.float32))
        if packed:
            group = PackedGroup(initial)
            outputs = [t.lookup(tf.constant(i)[step]) for t, i in zip(group.tables, ids)]
            embedding_vars = [group.variable]
        else:
            tables = [tf.compat.v1.get_variable(name, initializer=value) for name, value in initial]
            outputs = [tf.nn.embedding_lookup(t, tf.constant(i)[step]) for t, i in zip(tables, ids)]
            embedding_vars = tables
        features = tf.concat([tf.reduce_sum(o, 1) for o in outputs], 1)
        loss = tf.reduce_mean(tf.square(tf.matmul(features, dense) - tf.constant(labels)[step]))
        optimizer = _optimizer(kind)
        var_list = embedding_vars + [dense]
        grads = tf.gradients(loss, var_list)
        if packed:  # the user's per-table view of the gradients, merged back for the one apply
            grads = group.split_gradient(grads[0]) + grads[1:]
        norm = tf.linalg.global_norm(grads)
        grads = [tf.clip_by_norm(g, CLIP) for g in grads]
        if packed:
            grads = [group.merge_gradients(grads[:len(TABLES)])] + grads[len(TABLES):]
        # Every gradient before any update: a ref variable's reads in the backward pass are not snapshots (what
        # collective.integration.training.gradients_before_updates does in scope()).
        with tf.control_dependencies([g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]):
            train = optimizer.apply_gradients(list(zip(grads, var_list)))
        average = tf.train.ExponentialMovingAverage(0.5)
        with tf.control_dependencies([train]):
            train = average.apply(var_list)
        if packed:
            shadow = average.average(group.variable)
            group_vars = [group.variable, shadow] + [optimizer.get_slot(group.variable, n)
                                                     for n in optimizer.get_slot_names()]
            others = [v for v in tf.compat.v1.global_variables() if all(v is not g for g in group_vars)]
            saver = tf.compat.v1.train.Saver(group.saveables(optimizer, derived=[shadow]) + others)
            rows = [group.variable[t.offset:t.offset + t.rows] for t in group.tables]
            slots = [optimizer.get_slot(group.variable, name)[t.offset:t.offset + t.rows]
                     for name in optimizer.get_slot_names() for t in group.tables]
        else:
            saver = tf.compat.v1.train.Saver()
            rows = [t.value() for t in tables]
            slots = [optimizer.get_slot(t, name).value() for name in optimizer.get_slot_names() for t in tables]
        applies = sum(n for op, n in collections.Counter(o.type for o in graph.get_operations()).items()
                      if op.startswith("ResourceSparseApply") or op.startswith("ScatterAdd")
                      or op.startswith("SparseApply"))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first_norm = sess.run(norm, {step: 0})
            for s in range(STEPS):
                sess.run(train, {step: s})
            trained = sess.run(rows + slots)
            path = saver.save(sess, os.path.join(directory, "packed" if packed else "plain"))
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, path)
            restored = sess.run(rows + slots)
    stored = {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)}
    return {"trained": trained, "restored": restored, "norm": first_norm, "applies": applies, "stored": stored}


def check(kind: str) -> None:
    """Packed training equals unpacked training for optimizer ``kind`` under the behaviour of this process."""
    with tempfile.TemporaryDirectory() as directory:
        plain, packed = _train(False, kind, directory), _train(True, kind, directory)
    assert plain["applies"] == len(TABLES) and packed["applies"] == 1, (plain["applies"], packed["applies"])
    np.testing.assert_allclose(packed["norm"], plain["norm"], rtol=1e-6)
    assert len(packed["trained"]) == len(plain["trained"]) == 2 * len(TABLES)
    for got, want in zip(packed["trained"], plain["trained"]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for got, want in zip(packed["restored"], plain["trained"]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert sorted(packed["stored"]) == sorted(plain["stored"]), (sorted(packed["stored"]), sorted(plain["stored"]))
    for name, value in plain["stored"].items():
        np.testing.assert_allclose(packed["stored"][name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert {name for name, _ in TABLES} <= set(packed["stored"])


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_packed_group_trains_and_checkpoints_as_unpacked_tables_with_one_sparse_apply(kind):
    check(kind)


# The strategy's wiring (COLLECTIVE_PACKING=1, collective.embedding.packed_tables): a DLRM-like model of 26 tables of
# one dim made by get_variable in embedding_scope(), trained by the optimizer wrapper with global-norm clipping.
STRATEGY_TABLES, STRATEGY_DIM = 26, 3


def _strategy_train(packs: bool, directory: str, restore: str = "", count: int = STRATEGY_TABLES) -> dict:
    """Trains 2 steps and saves (``first``), restores ``restore`` if given, trains 1 more step and saves (``last``)."""
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import packing  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(11)
    strategy = CollectiveStrategy("hb")
    with tf.Graph().as_default() as graph, strategy.scope(), packing.using(packs):
        with strategy.embedding_scope():
            tables = [tf.compat.v1.get_variable(f"t{i}", [4 + i % 3, STRATEGY_DIM],
                                                initializer=tf.compat.v1.random_normal_initializer(seed=i))
                      for i in range(count)]
        ids = [tf.SparseTensor([[0, 0], [0, 1], [2, 0], [3, 0]], rng.integers(0, 4, 4), [4, 2]) for _ in tables]
        features = tf.concat(strategy_lookups(tables, ids), 1)
        dense = tf.compat.v1.get_variable("dense", initializer=rng.normal(size=(count * STRATEGY_DIM, 1))
                                          .astype(np.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(features, dense) - 1.0))
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.5)
        pairs = optimizer.compute_gradients(loss)
        clipped, norm = tf.clip_by_global_norm([g for g, _ in pairs], 0.5)
        train = optimizer.apply_gradients(list(zip(clipped, [v for _, v in pairs])))
        names = sorted(getattr(v, "name", "").split(":")[0] for _, v in pairs)
        applies = collections.Counter(op.type for op in graph.get_operations())["ResourceSparseApplyAdagrad"]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first_norm = sess.run(norm)
            for _ in range(2):
                sess.run(train)
            first = saver.save(sess, os.path.join(directory, f"{packs}{bool(restore)}-first"))
            if restore:
                sess.run(train)  # moves every table away from the checkpoint's values, which the restore brings back
                saver.restore(sess, restore)
            sess.run(train)
            last = saver.save(sess, os.path.join(directory, f"{packs}{bool(restore)}-last"))
    return {"first": first, "last": last, "applies": applies, "norm": first_norm, "names": names}


def strategy_lookups(tables, ids):
    """Each table's summed lookup of its ids, as a program writes it."""
    return [tf.nn.embedding_lookup_sparse(t, i, None, combiner="sum") for t, i in zip(tables, ids)]


def _stored(path: str) -> dict:
    return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)}


def _assert_same_checkpoint(got: str, want: str) -> None:
    got, want = _stored(got), _stored(want)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def check_strategy(count: int = STRATEGY_TABLES) -> None:
    """Packed tables (one group variable) train, clip, checkpoint and restore as unpacked ones, with one sparse
    apply instead of ``count``; an unpacked checkpoint restores into the packed model (the reverse, on other worker
    counts and under TF1 behaviour: tests/test_checkpoint.py::test_a_checkpoint_moves_between_packed_*)."""
    with tempfile.TemporaryDirectory() as directory:
        plain = _strategy_train(False, directory, count=count)
        packed = _strategy_train(True, directory, restore=plain["first"], count=count)
        assert plain["applies"] == count and packed["applies"] == 1, (plain["applies"], packed["applies"])
        assert packed["names"] == plain["names"] and f"t{count - 1}" in packed["names"], packed["names"]
        np.testing.assert_allclose(packed["norm"], plain["norm"], rtol=1e-6)
        _assert_same_checkpoint(packed["first"], plain["first"])  # names (slots included) and values
        assert f"t{count - 1}/Adagrad" in _stored(packed["first"])
        _assert_same_checkpoint(packed["last"], plain["last"])  # restored from the unpacked checkpoint
        assert not np.allclose(_stored(plain["last"])["t3"], _stored(plain["first"])["t3"])  # the last step moved it


def test_packed_tables_of_the_strategy_train_and_checkpoint_as_unpacked_with_one_sparse_apply():
    check_strategy()


def test_packed_group_under_tf1_behaviour():
    script = ("import tensorflow as tf; tf.compat.v1.disable_v2_behavior(); import tests.test_packed_group as t; "
              f"[t.check(k) for k in {OPTIMIZERS!r}]; t.check_unlooked_tables(); t.check_warm_start(); print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


def test_packed_group_refuses_tables_of_different_dims_and_partial_gradients():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"\['a', 'b'\] of one packing group need one dim"):
            PackedGroup([("a", np.zeros((3, 2), np.float32)), ("b", np.zeros((3, 4), np.float32))])
        group = PackedGroup([("a", np.zeros((3, 2), np.float32)), ("b", np.zeros((3, 2), np.float32))])
        grad = tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0], tf.int64), tf.constant([3, 2], tf.int64))
        with pytest.raises(ValueError, match=r"'a/packed' applies one IndexedSlices per table of \['a', 'b'\]"):
            group.merge_gradients([grad])


# A program that uses its packed tables as variables (collective.integration.packed, in scope()): two tables of one
# dim made by get_variable in embedding_scope(), each summed over its ids, so each row's gradient is its id count.
A_ROWS, B_ROWS, A_IDS, B_IDS = 5, 4, [4], [0, 2, 2]
EMA_DECAY = 0.5


def _packed_program(optimizer_of, column: bool = False, slots: bool = False) -> dict:
    """Builds the program with packing on (``column``: an embedding column's table too, then saved by a Saver of
    ``global_variables()``) and trains one step; what it saw while building (``slots``: ``get_slot`` of each
    table), and fetched after."""
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import packing  # pylint: disable=import-outside-toplevel
    from collective.embedding.packed_group import PackedTable  # pylint: disable=import-outside-toplevel
    strategy = CollectiveStrategy("hb")
    seen = {}
    with tf.Graph().as_default(), strategy.scope(), packing.using(True):
        with strategy.embedding_scope():
            a = tf.compat.v1.get_variable("a", [A_ROWS, 2], initializer=tf.compat.v1.constant_initializer(1.0))
            b = tf.compat.v1.get_variable("b", [B_ROWS, 2], initializer=tf.compat.v1.constant_initializer(2.0))
            seen["before_lookup"] = [v for v in tf.compat.v1.global_variables() if v.op.name == "b"]
            loss = 0.0
            if column:  # made and looked up first: its lookup seals the group of the three tables, "collective_packed/a"
                item = tf.compat.v1.feature_column.categorical_column_with_identity("item", 3)
                loss = tf.reduce_sum(tf.compat.v1.feature_column.input_layer(
                    {"item": tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])},
                    [tf.compat.v1.feature_column.embedding_column(item, 2)]))
            loss += (tf.reduce_sum(tf.nn.embedding_lookup(a, A_IDS))
                     + tf.reduce_sum(tf.nn.embedding_lookup(b, B_IDS)))
        assert isinstance(a, PackedTable) and isinstance(b, PackedTable) and a.group is b.group
        optimizer = optimizer_of()
        pairs = optimizer.compute_gradients(loss)
        train = optimizer.apply_gradients(pairs)
        seen.update(a=a, b=b, pairs=pairs, optimizer=optimizer, listed=tf.compat.v1.global_variables(),
                    in_scope_b=tf.compat.v1.global_variables("b"))
        if slots:
            slots = {name: optimizer.get_slot(t, "accumulator") for name, t in (("a", a), ("b", b))}
            seen["again"] = optimizer.get_slot(b, "accumulator")
        else:
            slots = {}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            seen["fetched"] = sess.run({"a": a, "b": b, **{f"slot/{k}": v for k, v in slots.items()}})
            seen["slots"] = slots
            if column:
                with tempfile.TemporaryDirectory() as directory:
                    path = tf.compat.v1.train.Saver(seen["listed"]).save(sess, os.path.join(directory, "ckpt"))
                    seen["saved"] = sorted(name for name, _ in tf.train.list_variables(path))
    return seen


def test_get_slot_of_a_packed_table_gives_its_rows_of_the_group_slot():
    seen = _packed_program(lambda: tf.compat.v1.train.AdagradOptimizer(0.5), slots=True)
    slot = seen["slots"]["b"]
    assert slot is seen["again"] and slot.name == "b/Adagrad" and slot.shape == (B_ROWS, 2), slot.name
    counts = {name: np.bincount(ids, minlength=rows)[:, None] * np.ones(2)
              for name, ids, rows in (("a", A_IDS, A_ROWS), ("b", B_IDS, B_ROWS))}
    for name, start in (("a", 1.0), ("b", 2.0)):  # b lies after a in the group: a slot read at offset 0 fails it
        accumulator = 0.1 + counts[name] ** 2
        np.testing.assert_allclose(seen["fetched"][f"slot/{name}"], accumulator, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(seen["fetched"][name], start - 0.5 * counts[name] / np.sqrt(accumulator),
                                   rtol=1e-6, err_msg=name)


def test_a_packed_table_is_found_by_name_in_global_variables():
    seen = _packed_program(lambda: tf.compat.v1.train.AdagradOptimizer(0.5), column=True)
    a, b = seen["a"], seen["b"]
    assert seen["before_lookup"] == [b]  # not sealed yet: no group variable exists
    by_name = {v.op.name: v for v in seen["listed"]}
    [column] = [v for v in seen["listed"] if v.op.name.endswith("embedding_weights")]  # as a recipe finds it
    assert by_name["a"] is a and by_name["b"] is b and column.group is a.group, sorted(by_name)
    assert "collective_packed/a" not in by_name and seen["in_scope_b"][0] is b, sorted(by_name)
    assert [v.op.name for v in seen["in_scope_b"]] == ["b", "b/Adagrad"]  # as TensorFlow lists b and its slot
    assert {id(a), id(b), id(column)} <= {id(v) for _, v in seen["pairs"]}  # the objects the gradients are paired to
    assert {"a", "b", column.name, "a/Adagrad", "b/Adagrad", f"{column.name}/Adagrad"} <= set(seen["saved"]), \
        seen["saved"]
    assert not any("packed" in name for name in seen["saved"]), seen["saved"]


def _unlooked_program(directory: str, restore: str = "") -> dict:
    """Tables ``a``, ``b`` looked up and ``c`` (one dim, made in ``embedding_scope()`` after their lookups) never
    looked up, packing on:
    initialised and saved by the default initializer and Saver; ``restore``: built again and restored without an
    initializer (Estimator's evaluate and predict), then written through the table's own ``assign`` and
    ``scatter_*``, then restored from the tables' moving averages (``variables_to_restore()``, the serving
    recipe). Training sums b's gradient into ``tf.Variable(tf.zeros_like(b))`` and keeps every table's moving
    average (``ema.apply()``)."""
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import packing  # pylint: disable=import-outside-toplevel
    strategy = CollectiveStrategy("hb")
    seen = {}
    with tf.Graph().as_default(), strategy.scope(), packing.using(True):
        with strategy.embedding_scope():
            def make(name, rows, value):
                return tf.compat.v1.get_variable(name, [rows, 2], initializer=tf.compat.v1.constant_initializer(value))

            tables = {"a": make("a", A_ROWS, 1.0), "b": make("b", B_ROWS, 2.0)}
            loss = (tf.reduce_sum(tf.nn.embedding_lookup(tables["a"], A_IDS))
                    + tf.reduce_sum(tf.nn.embedding_lookup(tables["b"], B_IDS)))
            tables["c"] = make("c", 3, 3.0)  # after a's and b's group is sealed: a group of its own, never looked up
        ema = tf.compat.v1.train.ExponentialMovingAverage(EMA_DECAY)
        if not restore:  # b's gradient summed into a variable made from b, then every table's moving average
            acc = tf.Variable(tf.zeros_like(tables["b"]), trainable=False, name="acc")
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
            pairs = optimizer.compute_gradients(loss, [tables["a"], tables["b"]])
            accumulate = tf.compat.v1.scatter_add(acc, pairs[1][0].indices, pairs[1][0].values)
            with tf.control_dependencies([accumulate]):
                apply = optimizer.apply_gradients(pairs)
            with tf.control_dependencies([apply]):
                train = ema.apply()  # the trainable variables: a, b and c
            seen["trainable"] = sorted(v.op.name for v in tf.compat.v1.trainable_variables())
            seen["shadow_b"] = ema.average(tables["b"])
        else:
            ema_saver = tf.compat.v1.train.Saver(ema.variables_to_restore())  # the serving recipe: shadows as tables
        if restore:
            c = tables["c"]
            writes = [c.assign(tf.fill([3, 2], 7.0)), c.scatter_update(tf.IndexedSlices(tf.fill([1, 2], 9.0), [2])),
                      c.assign_add(tf.ones([3, 2]), read_value=False),
                      c.scatter_sub(tf.IndexedSlices(tf.fill([1, 2], 4.0), [0]))]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            if restore:
                saver.restore(sess, restore)
                seen["restored"] = sess.run(tables)
                for write in writes:
                    sess.run(write)
                seen["written"] = sess.run(tables)
                seen["refs"] = {t.ref() for t in tables.values()} | {tables["c"].ref()}
                ema_saver.restore(sess, restore)
                seen["ema_restored"] = sess.run(tables)
            else:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(train)
                seen["trained"] = sess.run(tables)
                seen["shadow_b"] = sess.run(seen["shadow_b"])
                seen["path"] = saver.save(sess, os.path.join(directory, "ckpt"))
    return seen


def check_unlooked_tables() -> None:
    """A packed table never looked up is initialised, saved under its name, restored without an initializer
    (with its group's other tables) and written by its own ``assign`` / ``scatter_*``; packed tables are listed by
    ``trainable_variables()``, and a moving average of each and a variable made from one are saved as one
    process's (``<table>/ExponentialMovingAverage``, ``acc``) and restored by name; equal to numpy."""
    with tempfile.TemporaryDirectory() as directory:
        trained = _unlooked_program(directory)
        np.testing.assert_allclose(trained["trained"]["c"], np.full((3, 2), 3.0))
        stored = _stored(trained["path"])
        assert {"a", "b", "c"} <= set(stored) and not any("packed" in n for n in stored), sorted(stored)
        np.testing.assert_allclose(stored["c"], np.full((3, 2), 3.0))
        b = np.full((B_ROWS, 2), 2.0) - 0.5 * np.bincount(B_IDS, minlength=B_ROWS)[:, None]
        np.testing.assert_allclose(stored["b"], b)
        assert trained["trainable"] == ["a", "b", "c"], trained["trainable"]  # the tables, not their groups
        shadows = {name: EMA_DECAY * start + (1 - EMA_DECAY) * stored[name]
                   for name, start in (("a", 1.0), ("b", 2.0), ("c", 3.0))}  # one update from the initial value
        for name, shadow in shadows.items():
            np.testing.assert_allclose(stored[f"{name}/ExponentialMovingAverage"], shadow, err_msg=name)
        np.testing.assert_allclose(trained["shadow_b"], shadows["b"])
        np.testing.assert_allclose(stored["acc"], np.bincount(B_IDS, minlength=B_ROWS)[:, None] * np.ones(2))
        again = _unlooked_program(directory, restore=trained["path"])
        for name in "abc":
            np.testing.assert_allclose(again["restored"][name], trained["trained"][name], err_msg=name)
        c = np.full((3, 2), 7.0)
        c[2] = 9.0
        c += 1.0
        c[0] -= 4.0
        np.testing.assert_allclose(again["written"]["c"], c)
        np.testing.assert_allclose(again["written"]["b"], trained["trained"]["b"])  # c's writes keep b's rows
        assert len(again["refs"]) == 3
        for name, shadow in shadows.items():
            np.testing.assert_allclose(again["ema_restored"][name], shadow, err_msg=name)


def test_packed_tables_not_looked_up_are_initialised_saved_written_and_restored_without_an_initializer():
    check_unlooked_tables()


WARM = {"ws/a": (5, 1), "ws/b": (4, 2), "ws2/c": (3, 3), "ws4/e": (2, 4)}  # name: (rows, seed of its stored value)


def _warm_value(name: str) -> np.ndarray:
    rows, seed = WARM[name]
    return np.random.default_rng(seed).normal(size=(rows, 2)).astype(np.float32)


def check_warm_start() -> None:
    """Packed tables warm-start from a plain TensorFlow checkpoint as variables do: a scope mapping
    (``init_from_checkpoint({"ws/": "ws/"})``) and ``warm_start(vars_to_warm_start="ws2/.*")`` after the group is
    sealed, a one-to-one mapping onto a table made after the seal; a table not named keeps its own initial value."""
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import packing  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "warm")
        with tf.Graph().as_default():
            stored = [tf.compat.v1.get_variable(name, initializer=_warm_value(name)) for name in WARM]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                tf.compat.v1.train.Saver(stored).save(sess, path)
        strategy = CollectiveStrategy("hb")
        with tf.Graph().as_default(), strategy.scope(), packing.using(True):
            with strategy.embedding_scope():
                rows = {"ws/a": 5, "ws/b": 4, "ws2/c": 3, "ws3/d": 3}
                tables = {name: tf.compat.v1.get_variable(name, [count, 2],
                                                          initializer=tf.compat.v1.constant_initializer(7.0))
                          for name, count in rows.items()}
                tf.nn.embedding_lookup(tables["ws/a"], [0])  # seals the group of the four
                tables["e"] = tf.compat.v1.get_variable("ws4/e", [2, 2], initializer=tf.compat.v1.zeros_initializer())
            assert tables["ws/a"].group is tables["ws3/d"].group
            tf.compat.v1.train.init_from_checkpoint(path, {"ws/": "ws/"})
            tf.compat.v1.train.warm_start(path, vars_to_warm_start="ws2/.*")
            tf.compat.v1.train.init_from_checkpoint(path, {"ws4/e": tables["e"]})
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got = sess.run(tables)
    for name in ("ws/a", "ws/b", "ws2/c"):
        np.testing.assert_array_equal(got[name], _warm_value(name), err_msg=name)
    np.testing.assert_array_equal(got["e"], _warm_value("ws4/e"))
    np.testing.assert_array_equal(got["ws3/d"], np.full((3, 2), 7.0))  # not warm-started


def test_packed_tables_warm_start_from_a_checkpoint_as_variables_do():
    check_warm_start()


def test_a_packed_26_table_dlrm_step_holds_one_sparse_apply_per_packing_group():
    """The zoo's DLRM as the benchmarks train it (26 Criteo tables of one dim through feature columns and
    ``input_layer``, Adagrad): one sparse apply for its one packing group, against one per table unpacked.
    Regression: TensorFlow's ``safe_embedding_lookup_sparse`` asked each table for its graph element
    (``name_scope(values=...)``), which sealed its group before the next column's table was made, so every table
    had a group of its own (``packed_group.seals_deferred`` inside ``input_layer``'s coalesced lookups)."""
    from benchmarks import config as configs  # pylint: disable=import-outside-toplevel
    from benchmarks import graph_build  # pylint: disable=import-outside-toplevel

    built = graph_build.measure(configs.load("packing_quick"), ["dlrm"], repeats=1)
    assert built["dlrm hb"]["sparse_applies"] == 26 and built["dlrm hb_packed"]["sparse_applies"] == 1, built
    assert built["dlrm hb_packed"]["ops"] < built["dlrm hb"]["ops"], built
