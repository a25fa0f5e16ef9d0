"""SOK v2 (sok.Variable, DynamicVariable, lookup_sparse, OptimizerWrapper, dump/load) on 1, 2 and 3 workers.

One job per world size runs every case (tests/workers/sok_v2_worker.py): the
SOK program over Adam and SGD against a pure-TF twin on the global batch
(float64, 1e-4 asked, ~1e-12 seen), the dump of the Adam run loaded on another
world size (2 -> 3, 3 -> 1) with identical vectors and slots, incremental
dumps (sok.incremental_dump) of an Adagrad run: the keys each holds, and a
full dump plus two incremental ones loaded on another world size equal to the
uninterrupted run key by key, and bad input.
"""
import pathlib
import sys

import numpy as np
import pytest

from launcher import launch_once, load_rank_results, run_workers

sys.path.insert(0, str(pathlib.Path(__file__).parent / "workers"))
from workers import sok_v2_cases as cases  # noqa: E402

# Order matters: each job loads the previous one's dump; the first one also trains the pure-TF twins.
JOBS = [(2, None), (3, 2), (1, 3)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("sok_v2")


@launch_once
def _job(base, n):
    previous = dict(JOBS)[n]
    if previous is not None:
        _job(base, previous)
    out = base / f"n{n}"
    out.mkdir(exist_ok=True)
    run_workers("sok_v2_worker.py", n, [out, base / f"n{previous}" if previous else "-"], timeout=300)
    return load_rank_results(out, n)


def _logical(ranks, prefix, name, what="values"):
    """``{key: row}`` over every worker's rows of table ``name``."""
    table = {}
    for res in ranks:
        for key, row in zip(res[f"{prefix}/{name}/keys"], res[f"{prefix}/{name}/{what}"]):
            assert int(key) not in table, f"{prefix}/{name}: key {key} on two workers"
            table[int(key)] = row
    return table


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", ["adam", "sgd", "tf1_adam", "tf1_sgd"])
def test_matches_pure_tf_twin(base, n, kind):
    """TF2 (tf.function, Keras optimizers) and TF1 graphs (tf.compat.v1.train optimizers)."""
    ranks = _job(base, n)
    twin = _job(base, JOBS[0][0])[0]  # the first launch computes the twins (they do not depend on n)
    # The twin trained (else both sides could sit at their initial values and still agree).
    for name, start in {**cases.initial_tables(), "kernel": cases.dense_weights()[0]}.items():
        assert np.abs(twin[f"twin_{kind}/{name}"] - start).max() > 1e-2, f"the {kind} twin did not move {name}"
    for name, (rows, _) in cases.TABLES.items():
        got = _logical(ranks, kind, name)
        assert sorted(got) == list(range(rows))
        np.testing.assert_allclose(np.stack([got[i] for i in range(rows)]), twin[f"twin_{kind}/{name}"], atol=1e-4,
                                   err_msg=f"{kind} {name} on {n}")
    got = _logical(ranks, kind, "c")
    assert sorted(got) == sorted(int(k) for k in cases.KEYS_C if k in got)
    for i, key in enumerate(cases.KEYS_C):
        if int(key) in got:
            np.testing.assert_allclose(got[int(key)], twin[f"twin_{kind}/c"][i], atol=1e-4, err_msg=f"c key {key}")
        else:  # never looked up: still its initial vector in the twin
            np.testing.assert_allclose(twin[f"twin_{kind}/c"][i], cases.INIT_C)
    for r in ranks:
        for w in ("kernel", "bias"):
            np.testing.assert_allclose(r[f"{kind}/{w}"], twin[f"twin_{kind}/{w}"], atol=1e-4)


@pytest.mark.parametrize("n, previous", [(3, 2), (1, 3)])
def test_dump_on_n_loads_on_m(base, n, previous):
    loaded, dumped = _job(base, n), _job(base, previous)
    for name in ("a", "b", "c"):
        for what in ("values", "slot_momentums", "slot_velocities"):
            want, got = _logical(dumped, "adam", name, what), _logical(loaded, "loaded", name, what)
            assert sorted(got) == sorted(want), f"{name} {what}"
            assert any(np.any(v) for v in want.values())
            for key, row in want.items():
                np.testing.assert_array_equal(got[key], row, err_msg=f"{name} {what} key {key}")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_bad_input_is_refused_naming_the_variable(base, n):
    for res in _job(base, n):
        assert "'max'" in str(res["error/combiner"]) and "adam_b" in str(res["error/combiner"])
        assert "adam_a" in str(res["error/range"]) and "[0, 40)" in str(res["error/range"])
        assert "localized:0" in str(res["error/localized"]) and "not supported" in str(res["error/localized"])


@pytest.mark.parametrize("n", [2, 3])
def test_one_exchange_serves_the_fixed_tables(base, n):
    """In the TF1 graph, the two sok.Variable tables share one exchange; the DynamicVariable has its own
    (collective's rule: each hash table exchanges alone), so 2 allgathers and 2 alltoalls where 3 lookups would
    make 3 of each."""
    for res in _job(base, n):
        ops = list(res["tf1_adam/lookup_collectives"])
        assert ops.count("HorovodAlltoall") == 2, ops
        assert ops.count("HorovodAllgather") == 2, ops


def _distinct(name, steps):
    """How many distinct ids of table ``name`` (keys of ``c``) the global batches of ``steps`` look up."""
    return len({int(i) for s in steps for row in cases.batch(s)[0][name] for i in row})


@pytest.mark.parametrize("n", [1, 2, 3])
def test_incremental_dump_holds_the_keys_updated_at_or_after_its_time(base, n):
    """Adagrad and TF1 SGD update only the rows looked up; Adam moves every row at each step."""
    every = [cases.TABLES["a"][0], cases.TABLES["b"][0], _distinct("c", range(cases.STEPS))]
    for res in _job(base, n):
        assert res["inc_counts/after2"].tolist() == [_distinct(t, [1, 2]) for t in "abc"]
        assert res["inc_counts/after3"].tolist() == [_distinct(t, [3]) for t in "abc"]
        assert res["adam_inc_counts"].tolist() == [every, [0, 0, 0]]
        assert res["tf1_adam/inc_counts"].tolist() == [every, [0, 0, 0]]
        assert res["tf1_sgd/inc_counts"].tolist() == [[_distinct(t, range(cases.STEPS)) for t in "abc"], [0, 0, 0]]


@pytest.mark.parametrize("n, previous", [(3, 2), (1, 3)])
def test_full_then_incremental_dumps_load_on_m_to_the_uninterrupted_tables_and_slots(base, n, previous):
    loaded, dumped = _job(base, n), _job(base, previous)
    for name in ("a", "b", "c"):
        whats = sorted(k.split("/")[-1] for k in dumped[0] if k.startswith(f"adagrad/{name}/") and not
                       k.endswith("/keys"))
        assert whats == ["slot_accumulators", "values"], whats
        for what in whats:
            want, got = _logical(dumped, "adagrad", name, what), _logical(loaded, "inc_loaded", name, what)
            assert sorted(got) == sorted(want), f"{name} {what}"
            for key, row in want.items():
                np.testing.assert_array_equal(got[key], row, err_msg=f"{name} {what} key {key}")
