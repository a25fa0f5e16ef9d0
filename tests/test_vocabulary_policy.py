"""Dynamic vocabularies (issue 31): admission, eviction by each policy, LRU/LFU at capacity, freed rows reused
with their slots reset, tables growing from an initial capacity, on 1, 2 and 3 workers with the hb and sok
backends. One launch per worker count runs every case; each worker count is compared key by key with the
1-worker run, that run's decisions with a numpy model of the policy, and each growing table bit for bit with
its twin allocated at its capacity."""

import pathlib

import numpy as np
import pytest

from launcher import launch_once, load_rank_results, run_workers
from workers import policy_cases as cases

WORKERS = [1, 2, 3]


@launch_once
def _job(base: pathlib.Path, n: int):
    """Launch ``n``'s per-rank results; it restores launch ``n - 1``'s checkpoints (1 -> 1, 1 -> 2, 2 -> 3)."""
    if n > 1:
        _job(base, n - 1)
    out = base / f"policy-{n}"
    out.mkdir(parents=True, exist_ok=True)
    run_workers("policy_worker.py", n, [out, base / f"policy-{n - 1}" if n > 1 else "-"], timeout=600)
    return load_rank_results(out, n)


class _Runs:
    """``runs[n]``: launch ``n``'s per-rank results, launched on first use."""

    def __init__(self, base: pathlib.Path):
        self.base = base

    def __getitem__(self, n: int):
        return _job(self.base, n)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _Runs(pathlib.Path(tmp_path_factory.mktemp("policy")))


@pytest.mark.parametrize("n", WORKERS)
def test_each_worker_count_runs_every_case(runs, n):
    """The launches, in order, each in its own test (and time limit): every case ran on every worker."""
    assert len(runs[n]) == n and all(f"{b}_{c}_losses" in res for b, c in cases.RUNS for res in runs[n])


def merged(res, prefix: str, field: str):
    """``{key: row}`` of ``field`` over all ranks, checking each key is held once, by its owner."""
    n = len(res)
    out = {}
    for r in range(n):
        for key, row in zip(res[r][prefix + "keys"].tolist(), res[r][prefix + field]):
            assert key % n == r and key not in out, f"key {key} on rank {r} of {n}"
            out[key] = row
    return out


def held_per_step(res, prefix: str):
    steps = []
    for r in range(len(res)):
        keys, splits = res[r][prefix + "held_per_step"], res[r][prefix + "held_splits"]
        per = [set(keys[a:b].tolist()) for a, b in zip(splits[:-1], splits[1:])]
        steps = per if not steps else [s | p for s, p in zip(steps, per)]
    return steps


def model_run(case: str, norms=None):
    policy, _, steps, total = cases.CASES[case]
    model = cases.PolicyModel(policy, total or 64)
    held = []
    for step in range(steps):
        keys, _ = cases.global_batch(case, step)
        model.lookup(keys, step)
        model.after_update(step + 1, norms)
        if step + 1 in cases.SAVES.get(case, ()):
            model.after_save(step + 1, norms)
        held.append(dict(model.held))
    return model, held


@pytest.mark.parametrize("backend,case", [run for run in cases.RUNS if run[1] != "l2" and cases.CASES[run[1]][0]])
def test_one_worker_decides_as_the_numpy_model(runs, backend, case):
    res = runs[1]
    prefix = f"{backend}_{case}_"
    model, held = model_run(case)
    got = held_per_step(res, prefix)
    for step, (want, have) in enumerate(zip(held, got)):
        assert have == set(want), f"step {step}: held {sorted(have)}, model {sorted(want)}"
    usage = merged(res, prefix, "usage")
    assert {k: tuple(v) for k, v in usage.items()} == model.held
    if model.p.get("min_count", 1) > 1:
        counter = {k: tuple(v) for k, v in zip(res[0][prefix + "counter_keys"].tolist(),
                                               res[0][prefix + "counter_usage"])}
        assert counter == model.counter
    # The case evicts: some keys seen were dropped (and, for admission, some never admitted).
    seen = set(np.concatenate([cases.global_batch(case, s)[0].ravel() for s in range(cases.CASES[case][2])]).tolist())
    assert len(model.held) < len(seen)


@pytest.mark.parametrize("backend", cases.BACKENDS)
def test_lru_lfu_tables_fill_and_keep_training(runs, backend):
    """At capacity the tables evict instead of failing: the model's peak fill passes max_fill of the capacity."""
    for case in set(cases.BACKEND_CASES[backend]) & {"lru", "lfu"}:
        policy, _, steps, total = cases.CASES[case]
        model = cases.PolicyModel(policy, total)
        peak = 0
        for step in range(steps):
            model.lookup(cases.global_batch(case, step)[0], step)
            peak = max(peak, len(model.held))
            model.after_update(step + 1)
        assert peak > policy["max_fill"] * total and len(runs[1][0][f"{backend}_{case}_losses"]) == steps


def test_lru_keeps_the_keys_of_the_last_step(runs):
    """Regression: when the keys of the step just trained exceeded fill_after_evict, an LRU run kept keys younger
    than one step, which no key is after an update, and emptied the table (the ``lru`` case did at step 4). After
    every step the 1-worker run of each LRU case (both backends, the growing twin) and the numpy model hold every
    key of that step, and the case does evict at capacity (so the rule is exercised)."""
    _, held = model_run("lru")
    lru_runs = [(b, c) for b, c in cases.RUNS if cases.CASES[c][0].get("evict_strategy") == "lru"]
    assert len(lru_runs) == 3, lru_runs
    for backend, case in lru_runs:
        got = held_per_step(runs[1], f"{backend}_{case}_")
        assert len(got) == len(held) == cases.CASES[case][2], (backend, case)
        for step, (now, workers) in enumerate(zip(held, got)):
            last = set(np.unique(cases.global_batch(case, step)[0]).tolist())
            assert last <= set(now), ("model", step)
            assert last <= workers, f"{backend} {case}: step {step}'s keys {sorted(last - workers)} were evicted"
    assert any(len(b) < len(a) for a, b in zip(held, held[1:])), "the lru case must evict"


def test_l2_eviction_keeps_only_rows_above_the_threshold(runs):
    threshold = cases.CASES["l2"][0]["l2_weight_threshold"]
    for backend in [b for b, case in cases.RUNS if case == "l2"]:
        prefix = f"{backend}_l2_"
        values = merged(runs[1], prefix, "values")
        norms = {k: np.linalg.norm(v.astype(np.float64)) for k, v in values.items()}
        assert norms and min(norms.values()) >= threshold  # evicted after every step's update
        seen = set(np.concatenate([cases.global_batch("l2", s)[0].ravel() for s in range(6)]).tolist())
        assert len(values) < len(seen)


@pytest.mark.parametrize("n", WORKERS[1:])
@pytest.mark.parametrize("backend,case", cases.RUNS)
def test_n_workers_train_what_one_trains(runs, n, backend, case):
    prefix = f"{backend}_{case}_"
    one, many = runs[1], runs[n]
    np.testing.assert_allclose(np.mean([many[r][prefix + "losses"] for r in range(n)], axis=0),
                               one[0][prefix + "losses"], rtol=1e-5)
    assert held_per_step(many, prefix) == held_per_step(one, prefix)
    fields = ["values"] + (["usage"] if prefix + "usage" in one[0] else []) + \
        sorted(f[len(prefix):] for f in one[0] if f.startswith(prefix + "slot_"))
    for field in fields:
        want, got = merged(one, prefix, field), merged(many, prefix, field)
        assert sorted(got) == sorted(want), field
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=f"{field} of key {key}")


@pytest.mark.parametrize("n", WORKERS)
def test_freed_rows_are_reset(runs, n):
    """After the last eviction run, rows past the held ones hold zeros and each slot's initial value."""
    for backend, case in cases.RUNS:
        initial = 0.1 if cases.CASES[case][1] == "Adagrad" else 0.0
        prefix = f"{backend}_{case}_"
        for res in runs[n]:
            size = int(res[prefix + "size"])
            assert size == len(res[prefix + "keys"])
            np.testing.assert_array_equal(res[prefix + "all_values"][size:], 0.0)
            slots = [field for field in res if field.startswith(prefix + "all_slot_")]
            assert slots
            for field in slots:
                np.testing.assert_allclose(res[field][size:], initial, err_msg=field)


@pytest.mark.parametrize("n", WORKERS)
@pytest.mark.parametrize("grown,allocated", sorted(cases.TWINS.items()))
def test_a_growing_table_trains_what_one_allocated_at_capacity_trains(runs, n, grown, allocated):
    """Bit for bit: losses, keys held after each step, and per key its values, slots and usage; the growing
    table's allocation grew from its initial size (every per-row variable alike), up to its capacity at most."""
    res = runs[n]
    a, b = f"hb_{grown}_", f"hb_{allocated}_"
    for r in range(n):
        np.testing.assert_array_equal(res[r][a + "losses"], res[r][b + "losses"])
        fields = sorted(f[len(b):] for f in res[r] if f.startswith(b) and not f.startswith(b + "all_"))
        assert fields == sorted(f[len(a):] for f in res[r] if f.startswith(a) and not f.startswith(a + "all_"))
        for field in fields:
            np.testing.assert_array_equal(res[r][a + field], res[r][b + field], err_msg=f"{grown} {field} rank {r}")
        rows = {f: res[r][f].shape[0] for f in res[r] if f.startswith(a + "all_")}
        capacity = cases.capacity(grown, n)
        assert res[r][b + "all_values"].shape[0] == capacity
        assert len(set(rows.values())) == 1 and cases.GROWTH[grown] < rows[a + "all_values"] <= capacity, rows
        assert rows[a + "all_values"] >= int(res[r][a + "size"])
    if n == 1 and grown == "grow_lru":  # grew up to its capacity, then LRU evicted there
        assert res[0][a + "all_values"].shape[0] == cases.capacity(grown, 1)
    if n == 3 and grown == "grow_none":  # stopped below the capacity of 64
        assert all(res[r][a + "all_values"].shape[0] < 64 for r in range(n))


@pytest.mark.parametrize("n", WORKERS)
def test_full_table_without_policy_names_table_and_options(runs, n):
    for backend, field in [(b, "full_error") for b in cases.BACKENDS] + [("hb", "full_error_grown")]:
        for r in range(n):
            message = str(runs[n][r][f"{backend}_{field}"])
            assert "hash table tiny_table is full" in message, message
            for option in ("capacity_per_worker", "evict_strategy=lru or lfu", "steps_to_live", "min_count",
                           "CounterFilter", "GlobalStepEvict", "DynamicVariable(evict_strategy"):
                assert option in message, (option, message)


@pytest.mark.parametrize("n", WORKERS)
def test_checkpoint_chain_restores_on_another_worker_count(runs, n, backend="hb"):
    """A full checkpoint plus a delta written by n - 1 workers (1 by 1) restores here key by key: rows, slots,
    counts and last-seen steps, and the counter table; keys evicted after the full save stay evicted."""
    saved, restored = runs[max(n - 1, 1)], runs[n]
    before, after = f"{backend}_admit_", f"{backend}_restored_"
    fields = ["values", "usage"] + [f[len(before):] for f in saved[0] if f.startswith(before + "slot_")]
    for field in fields:
        want, got = merged(saved, before, field), merged(restored, after, field)
        assert sorted(got) == sorted(want), field
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{field} of key {key}")
    for res in restored:  # the restored table grew from its initial rows to hold the keys, its slots alike
        rows = {f: res[f].shape[0] for f in res if f.startswith(after + "all_")}
        assert len(set(rows.values())) == 1 and len(res[after + "keys"]) <= rows[after + "all_values"] < 64, rows
    counter = {}
    for r in range(n):
        res = restored[r]
        for key, usage in zip(res[after + "counter_keys"].tolist(), res[after + "counter_usage"].tolist()):
            assert key % n == r
            counter[key] = tuple(usage)
    model, held = model_run("admit")
    assert counter == model.counter and set(merged(restored, after, "usage")) == set(model.held)
    # The chain's delta removed keys the full checkpoint held (tombstones).
    at_save = set(held[4])  # after step 5, when the full checkpoint was written (and evicted)
    assert at_save - set(model.held), "the case must evict keys between the full save and the delta"


@pytest.mark.parametrize("n", WORKERS)
def test_eviction_at_checkpoint_time(runs, n):
    """Policies with evict_at_checkpoint evict on every worker when a checkpoint is saved, before it is written:
    MonitoredTrainingSession's saver hook (the ``ckpt`` case evicts only then) writes the survivors of each
    save; a delta's tombstones are the keys its save's eviction (and the interval runs since the full save)
    dropped (the ``admit`` case, Saver.save and save_incremental). The held keys per step are checked against
    the numpy model and the 1-worker run by the tests above."""
    _, held = model_run("ckpt")
    for step in cases.SAVES["ckpt"]:
        saved = runs[n][0][f"hb_ckpt_saved_{step}"].tolist()
        assert saved == sorted(held[step - 1]), f"checkpoint of step {step} on {n} workers"
    model, evicted = cases.PolicyModel(cases.CASES["ckpt"][0], 64), []
    for step in range(cases.CASES["ckpt"][2]):
        model.lookup(cases.global_batch("ckpt", step)[0], step)
        model.after_update(step + 1)
        if step + 1 in cases.SAVES["ckpt"]:
            before = set(model.held)
            model.after_save(step + 1)
            evicted.append(before - set(model.held))
    assert any(evicted), "the case must evict at a save"
    for s in range(1, len(held)):  # no eviction between saves: held keys only grow
        assert s + 1 in cases.SAVES["ckpt"] or set(held[s - 1]) <= set(held[s]), s
    model, held = model_run("admit")
    for backend in cases.BACKENDS:
        got = runs[n][0][f"{backend}_admit_tombstones"].tolist()
        want = sorted(set(held[cases.SAVES["admit"][0] - 1]) - set(model.held))
        assert got == want and got, f"{backend} tombstones on {n} workers"


@pytest.mark.parametrize("n", WORKERS)
def test_checkpoint_without_policy_restores_into_a_policy_table(runs, n):
    """Regression: restoring a checkpoint written without a policy into a table with one failed (NotFound for
    the usage). Rows and slots come back key by key (written by n - 1 workers, by 1 for 1); each key starts as
    admitted at the restored step, (min_count, 3), and the counter table is empty."""
    saved, restored = runs[max(n - 1, 1)], runs[n]
    for field in ("values", "slot_Adagrad"):
        want, got = merged(saved, "hb_nopolicy_", field), merged(restored, "hb_unpoliced_", field)
        assert sorted(got) == sorted(want) and want, field
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{field} of key {key}")
    min_count = cases.CASES["admit"][0]["min_count"]
    for key, usage in merged(restored, "hb_unpoliced_", "usage").items():
        assert tuple(usage) == (min_count, 3), (key, usage)
    for res in restored:
        assert len(res["hb_unpoliced_counter_keys"]) == 0


def test_export_serves_the_default_for_evicted_and_unadmitted_keys(runs):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    default = cases.CASES["admit"][0]["default_value"]
    for backend in ("hb",):
        res = runs[1]
        exported = str(res[0][f"{backend}_exported"])
        values = merged(res, f"{backend}_restored_", "values")
        seen = np.unique(np.concatenate([cases.global_batch("admit", s)[0].ravel() for s in range(9)]))
        probe = np.concatenate([seen, [10 ** 12, -3]]).astype(np.int64)
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, [tf.saved_model.SERVING], exported)
            signature = meta.signature_def[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
            got = sess.run(signature.outputs["vectors"].name, {signature.inputs["keys"].name: probe})
        assert 0 < len(values) < len(seen)
        for key, vector in zip(probe.tolist(), got):
            want = values.get(key, np.full(cases.DIM, default, np.float32))
            np.testing.assert_array_equal(vector, want, err_msg=f"{backend} key {key}")


# ---------------------------------------------------------------- the policy object and the API mappings, one process

def test_policy_keywords_are_checked_naming_the_table():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    policy = hash_table.VocabularyPolicy(min_count=2, default_value=[1, 2])
    assert policy.default_row(2) == (1.0, 2.0) and hash_table.VocabularyPolicy().default_row(3) == (0.0,) * 3
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="hash table 'items'.*min_count=0 must be >= 1.*evict_strategy='mru'"):
            hash_table.hash_embedding_variable("items", 2, 8, min_count=0, evict_strategy="mru")
        with pytest.raises(ValueError, match="hash table 'items'.*default_value has 2 numbers; give one or dim=3"):
            hash_table.hash_embedding_variable("items", 3, 8, default_value=[1, 2])
        with pytest.raises(TypeError, match="hash table 'items'.*unknown keyword arguments \\['min_cnt'\\]"):
            hash_table.hash_embedding_variable("items", 3, 8, min_cnt=2)
        with pytest.raises(TypeError, match="either policy=VocabularyPolicy"):
            hash_table.hash_embedding_variable("items", 3, 8, policy=policy, min_count=3)
        with pytest.raises(ValueError, match="hash table 'items'.*evicts but never runs: give evict_every_steps"):
            hash_table.hash_embedding_variable("items", 3, 8, steps_to_live=5, evict_every_steps=None)


def test_sok_dynamic_variable_maps_hkv_eviction_names():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import sok  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    with tf.Graph().as_default():
        var = sok.DynamicVariable(dimension=4, init_capacity=8, max_capacity=16, evict_strategy="kLfu",
                                  steps_to_live=10, name="dyn")
        index = hash_table.table_of(var)
        assert index.capacity == 16 and index.policy.evict_strategy == "lfu" and index.policy.steps_to_live == 10
        assert index.growth.sizes == [8, 16] and var.shape.as_list() == [None, 4]
        fixed = hash_table.table_of(sok.DynamicVariable(dimension=4, init_capacity=16, max_capacity=16, name="d3"))
        assert fixed.growth is None and fixed.values.shape.as_list() == [16, 4]
        with pytest.raises(ValueError, match="sok.DynamicVariable 'dyn2': evict_strategy='kEpochLru' is not"):
            sok.DynamicVariable(dimension=4, max_capacity=16, evict_strategy="kEpochLru", name="dyn2")


def test_eviction_moves_update_times_with_the_rows():
    """Regression: compaction moved the touched mask but not SOK's per-row update times, so after an eviction a
    row's update time (what ``sok.incremental_dump`` selects by) belonged to the evicted key that held it before."""
    import time  # pylint: disable=import-outside-toplevel

    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.checkpoint import touched  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb")
    with tf.Graph().as_default(), strategy.scope():
        step = tf.compat.v1.train.get_or_create_global_step()
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        with strategy.embedding_scope():
            table = hash_table.hash_embedding_variable("t", 2, 8, steps_to_live=1, evict_every_steps=1)
        touched.record_update_times(table)
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, keys))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        held, _ = hash_table.table_of(table).entries()
        times = touched.row_state(table)[1][0]
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            sess.run(train, {keys: [5]})  # key 5 takes row 0
            time.sleep(0.05)
            before = time.time()
            for _ in range(3):  # key 7 takes row 1; key 5, not seen for more than one step, is evicted
                sess.run(train, {keys: [7]})
            got_keys, got_times = sess.run([held, times])
    assert got_keys.tolist() == [7], got_keys
    assert got_times[0] >= before, f"row 0 (key 7) carries an update time from before key 7 trained: {got_times}"
    assert np.all(np.isneginf(got_times[1:])), f"freed rows keep update times: {got_times}"


def _policy_table_program(strategy, make_optimizer, global_step: bool, alias: bool = False):
    """One policy table (steps_to_live=1, a run every step) trained by ``make_optimizer()``: ``(train, keys, held)``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    step = tf.compat.v1.train.get_or_create_global_step() if global_step else None
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    with strategy.embedding_scope():
        table = hash_table.hash_embedding_variable("t", 2, 8, steps_to_live=1, evict_every_steps=1)
    loss = tf.reduce_sum(tf.nn.embedding_lookup(table, keys))
    optimizer = make_optimizer()
    if alias:
        optimizer.iterations = step
    if hasattr(optimizer, "iterations"):
        return optimizer.apply_gradients(zip(tf.gradients(loss, [table]), [table])), keys, \
            hash_table.table_of(table).entries()[0]
    return optimizer.minimize(loss, global_step=step), keys, hash_table.table_of(table).entries()[0]


@pytest.mark.parametrize("kind", ["v1", "legacy", "v2", "legacy_alias"])
def test_keras_optimizers_move_the_policy_step(kind):
    """Regression: Keras optimizers count their own iterations, so the global step never moved and no eviction
    was ever due. Without a global step the policy makes one that follows the optimizer's iterations; with
    ``optimizer.iterations = global_step`` the optimizer moves it. Key 5, seen at step 0 only, is evicted at
    step 2 (more than one step old), as the tf.compat.v1.train run (``v1``, given the global step) evicts it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

    make = {"v1": lambda: tf.compat.v1.train.AdagradOptimizer(0.1), "v2": lambda: tf.keras.optimizers.Adagrad(0.1)}
    make = make.get(kind, lambda: tf.keras.optimizers.legacy.Adagrad(0.1))
    strategy = CollectiveStrategy("hb")
    with tf.Graph().as_default(), strategy.scope():
        train, keys, held = _policy_table_program(strategy, make, global_step=kind in ("v1", "legacy_alias"),
                                                  alias=kind == "legacy_alias")
        step = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            got = []
            for batch in ([5], [7], [7], [7]):
                sess.run(train, {keys: batch})
                got.append((sorted(sess.run(held).tolist()), int(sess.run(step))))
    assert got == [([5], 1), ([7], 2), ([7], 3), ([7], 4)], got


def test_optimizers_that_leave_the_policy_step_still_are_refused():
    """A Keras optimizer with its own iterations on a graph whose global step the program owns (something else
    would have to move it, racing the policy's reads), and a tf.compat.v1.train optimizer not given the global
    step the policy made: building the update fails naming the table and what to do."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb")
    with tf.Graph().as_default(), strategy.scope():
        with pytest.raises(ValueError, match="hash table t: .*Keras optimizer Adagrad .* optimizer.iterations = "
                                             "tf.compat.v1.train.get_global_step()"):
            _policy_table_program(strategy, lambda: tf.keras.optimizers.legacy.Adagrad(0.1), global_step=True)
    with tf.Graph().as_default(), strategy.scope():
        with pytest.raises(ValueError, match="hash table t: .*optimizer Adagrad is not given one.*pass global_step="):
            _policy_table_program(strategy, lambda: tf.compat.v1.train.AdagradOptimizer(0.1), global_step=False)


def test_estimator_with_deeprec_eviction_evicts_when_it_saves(tmp_path):
    """DeepRec's options without evict_every_steps evict when a checkpoint is saved, and only then: an Estimator
    (one worker; the rule's N-invariance is the ``ckpt`` case's) trained 9 steps with a save every 3 writes
    the numpy model's survivors of each save, as the ``ckpt`` case (the same policy) does."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective import hash_embedding_column as cfc  # pylint: disable=import-outside-toplevel

    option = cfc.EmbeddingVariableOption(capacity_per_worker=64, filter_option=cfc.CounterFilter(2),
                                         evict_option=cfc.GlobalStepEvict(2))
    assert option.policy.evict_at_checkpoint and option.policy.evict_every_steps is None
    steps = cases.CASES["ckpt"][2]
    strategy = CollectiveStrategy("hb")

    def model_fn(features, labels, mode):
        column = tf.feature_column.embedding_column(
            cfc.categorical_column_with_embedding("item", dtype=tf.int64, ev_option=option), cases.DIM)
        with strategy.embedding_scope():
            deep = tf.compat.v1.feature_column.input_layer(features, [column])
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(deep, axis=1, keepdims=True) - labels))
        train = tf.compat.v1.train.AdagradOptimizer(0.4).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    def input_fn():
        batches = [cases.global_batch("ckpt", s) for s in range(steps)]
        keys = np.stack([k for k, _ in batches])
        labels = np.stack([y for _, y in batches])
        return tf.data.Dataset.from_tensor_slices(({"item": keys}, labels))

    config = tf.estimator.RunConfig(save_checkpoints_steps=3, save_checkpoints_secs=None, log_step_count_steps=None)
    with strategy.scope(), tf.Graph().as_default():
        strategy.estimator(model_fn, str(tmp_path), config=config).train(input_fn, max_steps=steps)
    _, held = model_run("ckpt")
    name = "input_layer/item_embedding/embedding_weights/keys"
    for step in cases.SAVES["ckpt"]:
        saved = tf.train.load_checkpoint(str(tmp_path / f"model.ckpt-{step}")).get_tensor(name)
        assert sorted(saved.tolist()) == sorted(held[step - 1]), step


def test_sok_dynamic_variable_grows_from_init_capacity():
    """``DynamicVariable(init_capacity=2, max_capacity=64)`` trains bit for bit what one allocated at 64 trains
    (values, Adagrad slot, SOK's per-row update times), growing its values, slot and update times to 32 rows."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective import CollectiveStrategy, sok  # pylint: disable=import-outside-toplevel
    from collective.checkpoint import touched  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("sok")
    with tf.Graph().as_default(), strategy.scope():
        step = tf.compat.v1.train.get_or_create_global_step()
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        tables = [sok.DynamicVariable(dimension=3, init_capacity=init, max_capacity=64, name=f"dyn_{init}",
                                      initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=3))
                  for init in (2, 64)]
        loss = sum(tf.reduce_sum(tf.square(tf.nn.embedding_lookup(t, keys) - 1.0)) for t in tables)
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.3)
        train = optimizer.minimize(loss, global_step=step)
        state = []
        for table in tables:
            held, rows = hash_table.table_of(table).entries()
            slot = optimizer.get_slot(table, "accumulator")
            times = touched.row_state(table)[1][0]
            state.append([held, tf.gather(table, rows), tf.gather(slot, rows), tf.gather(times, rows),
                          tf.shape(table)[0], tf.shape(slot)[0], tf.shape(times)[0]])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i in range(6):
                sess.run(train, {keys: np.arange(4 * i, 4 * i + 6) * 3 - 7})
            grown, fixed = sess.run(state)
    for a, b in zip(grown[:4], fixed[:4]):
        np.testing.assert_array_equal(a, b)
    assert len(grown[0]) == 26 and grown[4:] == [32, 32, 32] and fixed[4:] == [64, 64, 64], (grown[4:], fixed[4:])


def test_saves_after_a_lookup_that_grew_the_table_hold_every_row(tmp_path):
    """Regression: a training lookup grows a table's values at once but its optimizer slots and touched mask only
    before their own update, so a save between the two (the lookup run alone, then a checkpoint) read past the end
    of the shorter slot or mask. Both saves now catch up: a chain of a full save and a delta, each written right
    after such a growth, restores into the table allocated at capacity key by key."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.checkpoint import Saver  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    def build(initial):
        step = tf.compat.v1.train.get_or_create_global_step()
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        table = hash_table.hash_embedding_variable(
            "grown", 3, capacity_per_worker=64, initial_capacity_per_worker=initial,
            initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=3))
        lookup = tf.nn.embedding_lookup(table, keys)
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.3)
        train = optimizer.minimize(tf.reduce_sum(tf.square(lookup - 1.0)), global_step=step)
        held, rows = hash_table.table_of(table).entries()
        state = [held, tf.gather(table, rows), tf.gather(optimizer.get_slot(table, "accumulator"), rows)]
        return keys, lookup, train, state

    def by_key(state, wanted=None):
        keys = state[0] if wanted is None else np.array(wanted)
        at = {int(k): i for i, k in enumerate(state[0])}
        return [np.stack([part[at[int(k)]] for k in sorted(keys)]) for part in state]

    strategy = CollectiveStrategy("hb")
    chain = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default(), strategy.scope():
        keys, lookup, train, state = build(2)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {keys: [1, 2, 3]})
            sess.run(lookup, {keys: np.arange(10, 30)})  # values grow to 32 rows; the slot and mask stay at 4
            saver.save(sess, chain, global_step=1)
            sess.run(train, {keys: [2, 5]})
            sess.run(lookup, {keys: np.arange(30, 50)})  # values grow to 64 rows; the slot and mask stay at 32
            delta = saver.save_incremental(sess, chain, global_step=2)
            saved = sess.run(state)
    assert len(saved[0]) == 44
    with tf.Graph().as_default(), strategy.scope():
        keys, lookup, train, state = build(None)
        with tf.compat.v1.Session() as sess:
            saver = Saver()
            saver.restore(sess, delta)
            restored = sess.run(state)
    # The keys the last lookup added were never trained: no delta holds them (they start again from their
    # initializer when next seen).
    kept = [1, 2, 3, 5, *range(10, 30)]
    for ours, theirs in zip(by_key(saved, kept), by_key(restored, kept)):
        np.testing.assert_array_equal(ours, theirs)


def test_a_second_train_op_of_a_policy_table_evicts_too():
    """Regression (issue 40, 4): the eviction was built for the first update op of a policy table only, so a
    second train op (another optimizer) never evicted: key 5, seen at step 0 only, was still held at step 4 and a
    bounded table filled. Each train op now runs the eviction after its own update, as one train op does."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb")
    held_per_step = {}
    for ops in ("one", "two"):
        with tf.Graph().as_default(), strategy.scope():
            step = tf.compat.v1.train.get_or_create_global_step()
            keys = tf.compat.v1.placeholder(tf.int64, [None])
            with strategy.embedding_scope():
                table = hash_table.hash_embedding_variable("t", 2, 8, steps_to_live=1, evict_every_steps=1)
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, keys))
            first = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
            second = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step) \
                if ops == "two" else first
            held = hash_table.table_of(table).entries()[0]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(first, {keys: [5]})
                got = [sorted(sess.run(held).tolist())]
                for _ in range(3):
                    sess.run(second, {keys: [7]})
                    got.append(sorted(sess.run(held).tolist()))
        held_per_step[ops] = got
    assert held_per_step["one"] == [[5], [7], [7], [7]], held_per_step  # key 5 evicted at step 2
    assert held_per_step["two"] == held_per_step["one"], held_per_step


def test_a_policy_step_moved_by_another_optimizer_is_refused_and_the_rule_s_rewrite_is_deterministic():
    """Regression (issue 40, 2): tables trained by an optimizer not given the global step, dense layers by another
    that increments it, both in one tf.group: the eviction read the step after the table's update only, racing
    the other optimizer's increment, so identical runs held different keys. Building that update is now refused
    naming the table and the rule; the rewrite it asks for (the step given to the tables' optimizer, not to the
    dense one) holds the same keys as one optimizer, run after run."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb")

    def program(step_to_tables: bool):
        step = tf.compat.v1.train.get_or_create_global_step()
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        with strategy.embedding_scope():
            table = hash_table.hash_embedding_variable("t", 2, 8, steps_to_live=1, evict_every_steps=1)
        dense = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, keys) * dense)
        given = {"global_step": step}
        tables = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, var_list=[table],
                                                                   **(given if step_to_tables else {}))
        layers = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[dense],
                                                                           **({} if step_to_tables else given))
        return tf.group(tables, layers), keys, hash_table.table_of(table).entries()[0], step

    with tf.Graph().as_default(), strategy.scope():
        with pytest.raises(ValueError, match=r"hash table t: its vocabulary policy runs its eviction at intervals of "
                                             r"the global step global_step, .* optimizer Adagrad that updates it is "
                                             r"not given global_step=.*Pass global_step="):
            program(step_to_tables=False)
    runs = []
    for _ in range(3):
        with tf.Graph().as_default(), strategy.scope():
            train, keys, held, step = program(step_to_tables=True)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got = []
                for batch in ([5], [7], [7], [7]):
                    sess.run(train, {keys: batch})
                    got.append((sorted(sess.run(held).tolist()), int(sess.run(step))))
        runs.append(got)
    assert runs == [[([5], 1), ([7], 2), ([7], 3), ([7], 4)]] * 3, runs


def test_ftrl_trains_policy_and_growing_tables_as_a_table_allocated_at_its_capacity():
    """Regression (issue 40, 5): Ftrl, listed as supported, was refused on a policy table (its accumulator starts
    as ones(shape) * value, which the slot's initial row could not be read from) and failed on a growing table
    with a TensorFlow error naming no table (its slot initializer needs a static shape). Keys 7 and 9 (9 in a row
    the eviction of 5 freed) train the values and Ftrl slots a plain table of the capacity trains; the growing
    table holds every key with the plain table's rows."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy("hb")
    batches = ([5], [7], [7, 8, 10, 11, 12], [9, 7])

    def trained(**options):
        with tf.Graph().as_default(), strategy.scope():
            step = tf.compat.v1.train.get_or_create_global_step()
            keys = tf.compat.v1.placeholder(tf.int64, [None])
            with strategy.embedding_scope():
                table = hash_table.hash_embedding_variable("t", 2, 16, **options)
            loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, keys) - 1.0))
            optimizer = tf.compat.v1.train.FtrlOptimizer(0.1, initial_accumulator_value=0.2)
            train = optimizer.minimize(loss, global_step=step)
            held, rows = hash_table.table_of(table).entries()
            read = [held] + [tf.gather(v, rows) for v in (table, optimizer.get_slot(table, "accum"),
                                                            optimizer.get_slot(table, "linear"))]
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for batch in batches:
                    sess.run(train, {keys: batch})
                got = sess.run(read)
        return {int(k): [r[i] for r in got[1:]] for i, k in enumerate(got[0])}

    plain = trained()
    policy = trained(steps_to_live=1, evict_every_steps=1)
    growing = trained(initial_capacity_per_worker=4)
    assert sorted(plain) == [5, 7, 8, 9, 10, 11, 12] and sorted(policy) == [7, 9], sorted(policy)
    for key in (7, 9):
        for got, want in zip(policy[key], plain[key]):
            np.testing.assert_array_equal(got, want, err_msg=f"policy key {key}")
    assert sorted(growing) == sorted(plain)
    for key, rows in plain.items():
        for got, want in zip(growing[key], rows):
            np.testing.assert_array_equal(got, want, err_msg=f"growing key {key}")
