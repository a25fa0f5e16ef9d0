"""Sharded tables under CollectiveStrategy on 1, 2 and 3 workers, every backend.

Lookups are compared with numpy on the full logical table; training with the
same model in plain single-process TensorFlow on the whole global batch.
"""

import pathlib
import tempfile

import numpy as np
import pytest

from collective.sharding.layouts.column_wise import column_bounds
from launcher import launch_once, held, load_rank_results, run_workers
from workers import embedding_cases as cases

BACKENDS = ["hb", "sok", "replicated"]
WORKERS = [1, 2, 3]


@launch_once
def results_for(n):
    """One launch on ``n`` workers runs every backend: {backend: per-rank results}."""
    with tempfile.TemporaryDirectory(prefix=f"emb-{n}-") as out:
        run_workers("embedding_worker.py", n, [out, ",".join(BACKENDS), *cases.OPTIMIZERS])
        return {b: load_rank_results(pathlib.Path(out) / b, n) for b in BACKENDS}


def combine(table, rows, ids, weights, batch, combiner):
    out = np.zeros((batch, table.shape[1]), np.float64)
    for row in range(batch):
        sel = rows == row
        if not sel.any():
            continue
        w = weights[sel].astype(np.float64)
        total = (table[ids[sel]] * w[:, None]).sum(0)
        norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w ** 2).sum())}[combiner]
        out[row] = total / norm
    return out


@pytest.fixture(scope="module", params=[(b, n) for b in BACKENDS for n in WORKERS],
                ids=lambda p: f"{p[0]}-{p[1]}workers")
def sharded_run(request):
    backend, n = request.param
    return backend, n, results_for(n)[backend]


@pytest.fixture(scope="module")
def reference_training():
    batches = [cases.global_batch(step) for step in range(cases.STEPS)]
    return {name: cases.train(name, batches, with_small=True) for name in cases.OPTIMIZERS}


def test_each_worker_holds_its_rows_only(sharded_run):
    backend, n, res = sharded_run
    full = cases.table_values(1)
    for r in range(n):
        np.testing.assert_array_equal(res[r]["table_shard"], held(full, backend, r, n))


@pytest.mark.parametrize("key, seed", [("pretrained_v1", 3), ("pretrained_v2", 4)])
def test_pretrained_tables_are_sharded(sharded_run, key, seed):
    """Regression: get_variable(name, initializer=<a whole table>) was silently replicated and broadcast."""
    backend, n, res = sharded_run
    full = cases.table_values(seed)
    for r in range(n):
        dense, _, _ = cases.local_batch(0, r, n)
        np.testing.assert_array_equal(res[r][f"{key}_shard"], held(full, backend, r, n))
        np.testing.assert_allclose(res[r][f"{key}_dense"], full[dense], rtol=1e-6)


def test_dense_lookups_equal_numpy(sharded_run):
    _, n, res = sharded_run
    table = cases.table_values(1)
    for r in range(n):
        dense, _, _ = cases.local_batch(0, r, n)
        np.testing.assert_allclose(res[r]["dense"], table[dense], rtol=1e-6)
        np.testing.assert_allclose(res[r]["dense_v1_int32"], table[dense], rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sparse_lookups_equal_numpy(sharded_run, combiner):
    _, n, res = sharded_run
    table = cases.table_values(1)
    for r in range(n):
        dense, (rows, ids, weights), _ = cases.local_batch(0, r, n)
        ones = np.ones_like(weights)
        np.testing.assert_allclose(res[r][f"sparse_{combiner}"], combine(table, rows, ids, ones, len(dense), combiner),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res[r][f"weighted_{combiner}"],
                                   combine(table, rows, ids, weights, len(dense), combiner), rtol=1e-5, atol=1e-6)


def test_weights_get_their_gradient_through_the_exchange(sharded_run):
    """d/dw of sum(probe * lookup_sparse(sum)) is each id's row dotted with its sample's probe row."""
    _, n, res = sharded_run
    table = cases.table_values(1)
    for r in range(n):
        dense, (rows, ids, _), _ = cases.local_batch(0, r, n)
        expected = (table[ids] * cases.probe(len(dense))[rows]).sum(1)
        np.testing.assert_allclose(res[r]["weights_grad"], expected, rtol=1e-5, atol=1e-6)


def test_weight_sums_at_or_below_zero_divide_as_tensorflow(sharded_run):
    """mean: [1, -2] gives (v3 - 2 v5) / -1 (sign flipped), [1, -1] gives zeros (div_no_nan); sqrtn likewise."""
    _, n, res = sharded_run
    table = cases.table_values(1)
    for r in range(n):
        np.testing.assert_allclose(res[r]["signed_mean"][0], (table[3] - 2 * table[5]) / -1.0, rtol=1e-5)
        np.testing.assert_allclose(res[r]["signed_mean"][1], np.zeros(cases.DIM), atol=1e-6)
        np.testing.assert_allclose(res[r]["signed_sqrtn"][0], (table[3] - 2 * table[5]) / np.sqrt(5.0), rtol=1e-5)
        np.testing.assert_allclose(res[r]["signed_sqrtn"][1], (table[7] - table[2]) / np.sqrt(2.0), rtol=1e-5)


def test_ragged_ids_keep_their_rows(sharded_run):
    """Regression: tf.nn.embedding_lookup and a Keras Embedding on ragged ids failed at graph build on a sharded
    table (TensorFlow dispatches ragged ids from its own lookup only)."""
    _, n, res = sharded_run
    for r in range(n):
        dense, (rows, ids, _), _ = cases.local_batch(0, r, n)
        for key, table in (("ragged", cases.table_values(1)), ("keras_ragged", cases.table_values(5))):
            expected = np.zeros((len(dense), np.bincount(rows).max(), cases.DIM), np.float32)
            position = np.concatenate([np.arange(c) for c in np.bincount(rows, minlength=len(dense))])
            expected[rows, position] = table[ids]
            np.testing.assert_allclose(res[r][key], expected, rtol=1e-6, err_msg=key)


def test_partitioned_seeded_table_starts_as_one_process(sharded_run):
    """Regression: a partitioned table with a seeded random initializer started from another table than one
    process's (plain TensorFlow calls the initializer once per partition)."""
    backend, n, res = sharded_run
    full = cases.seeded_partitioned_table()
    for r in range(n):
        np.testing.assert_allclose(res[r]["seeded_shard"], held(full, backend, r, n), rtol=1e-6)


def test_safe_lookup_and_feature_column_equal_numpy(sharded_run):
    _, n, res = sharded_run
    for r in range(n):
        dense, (rows, ids, weights), _ = cases.local_batch(0, r, n)
        keep = (rows != 1) & (rows != 2)
        expected = combine(cases.table_values(1), rows[keep], ids[keep], np.ones(keep.sum()), len(dense), "mean")
        np.testing.assert_allclose(res[r]["safe_mean"], expected, rtol=1e-5, atol=1e-6)
        expected = combine(cases.table_values(2), rows, ids, np.ones_like(weights), len(dense), "sqrtn")
        np.testing.assert_allclose(res[r]["feature_column"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", cases.OPTIMIZERS)
def test_training_matches_one_process_on_the_global_batch(sharded_run, reference_training, optimizer):
    backend, n, res = sharded_run
    losses, (t1, t2), (w, b, small) = reference_training[optimizer]
    worker_losses = np.mean([res[r][f"{optimizer}_losses"] for r in range(n)], axis=0)
    np.testing.assert_allclose(worker_losses, losses, rtol=1e-5)
    for r in range(n):
        np.testing.assert_allclose(res[r][f"{optimizer}_t1"], held(t1, backend, r, n), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(res[r][f"{optimizer}_t2"], held(t2, backend, r, n), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(res[r][f"{optimizer}_w"], w, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(res[r][f"{optimizer}_b"], b, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(res[r][f"{optimizer}_small"], small, rtol=1e-4, atol=1e-6)
    # Training moved the tables: parity is not two untouched copies.
    assert not np.allclose(small, cases.table_values(3)[:2])
    assert not np.allclose(t1, cases.table_values(1))


@pytest.mark.parametrize("backend", ["hb", "sok"])
@pytest.mark.parametrize("n", [2, 3])
def test_table_wise_tables_train_as_one_process(backend, n, reference_training):
    """``sharding={"t1": "table_wise", "t2": "table_wise"}``: each table whole on one rank (the planner spreads
    them: t1 on rank 0, t2 on rank 1), the other ranks holding no rows; training equals one process."""
    res = results_for(n)[backend]
    losses, (t1, t2), (w, b, small) = reference_training[cases.OPTIMIZERS[-1]]
    holders = [0, 1]
    np.testing.assert_allclose(np.mean([res[r]["tw_losses"] for r in range(n)], axis=0), losses, rtol=1e-5)
    for r in range(n):
        assert res[r]["tw_holders"].tolist() == holders
        for got, want, holder in ((res[r]["tw_t1"], t1, holders[0]), (res[r]["tw_t2"], t2, holders[1])):
            np.testing.assert_allclose(got, want if r == holder else want[:0], rtol=1e-4, atol=1e-6)
        for key, want in (("tw_w", w), ("tw_b", b), ("tw_small", small)):
            np.testing.assert_allclose(res[r][key], want, rtol=1e-4, atol=1e-6)
        if backend == "hb":  # its checkpoint restores into row-wise tables and records the plan it was saved under
            np.testing.assert_allclose(res[r]["tw_restored_t1"], t1[r::n], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(res[r]["tw_restored_t2"], t2[r::n], rtol=1e-4, atol=1e-6)
            assert res[r]["tw_recorded"].tolist() == ["table_wise", "table_wise"]


@pytest.mark.parametrize("backend", ["hb", "sok"])
@pytest.mark.parametrize("n", WORKERS)
def test_column_wise_tables_train_as_one_process(backend, n, reference_training):
    """``sharding={"t1", "t2", "small": "column_wise"}``: each rank holds its columns of every row (4 dims on 3
    workers: 2, 1, 1; "small" has 2 rows, fewer than 3 workers), Adam's slots sliced alike; training equals one
    process, and (hb) its checkpoint holds the logical tables, "small"'s too (a block of 0 rows on 3 workers)."""
    res = results_for(n)[backend]
    losses, (t1, t2), (w, b, small) = reference_training[cases.OPTIMIZERS[-1]]  # one process: no scope to be in
    columns = column_bounds(cases.DIM, n)
    np.testing.assert_allclose(np.mean([res[r]["cw_losses"] for r in range(n)], axis=0), losses, rtol=1e-5)
    for r in range(n):
        assert res[r]["cw_placements"].tolist() == ["column_wise"] * 3
        lo, hi = columns[r], columns[r + 1]
        for key, want in (("cw_t1", t1), ("cw_t2", t2), ("cw_small", small)):
            np.testing.assert_allclose(res[r][key], want[:, lo:hi], rtol=1e-4, atol=1e-6, err_msg=key)
        for key, want in (("cw_w", w), ("cw_b", b)):
            np.testing.assert_allclose(res[r][key], want, rtol=1e-4, atol=1e-6)
        if backend == "hb" and n > 1:
            for key, want in (("cw_saved_t1", t1), ("cw_saved_t2", t2), ("cw_saved_small", small)):
                np.testing.assert_allclose(res[r][key], want, rtol=1e-4, atol=1e-6, err_msg=key)

