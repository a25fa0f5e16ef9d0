"""GroupEmbedding (DeepRec's API) on 1, 2 and 3 workers with both backends, against per-table lookups and numpy."""

import numpy as np
import pytest

from launcher import load_rank_results, run_workers
from test_embedding import combine
from workers import embedding_cases as cases

WORKERS = [1, 2, 3]
BACKENDS = ["hb", "sok"]
COMBINERS = ["mean", "sum", "sqrtn"]
DIMS = (4, 4, 6)


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"{n}workers")
def group_run(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"group-{n}")
    run_workers("api_group_embedding_worker.py", n, [out], timeout=900)
    return n, load_rank_results(out, n)


def _tables():
    return [np.random.default_rng(i).normal(0, 1, (cases.VOCAB, dim)).astype(np.float32)
            for i, dim in enumerate(DIMS)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_lookup_equals_per_table_lookups_and_numpy(group_run, backend):
    n, res = group_run
    tables = _tables()
    for r in range(n):
        dense, (rows, ids, weights), _ = cases.local_batch(0, r, n)
        keep = (rows != 1) & (rows != len(dense) - 1)
        inputs = [(rows, ids, np.ones_like(weights)), (rows, ids, weights),
                  (rows[keep], ids[keep], np.ones(keep.sum(), np.float32))]
        for i, (table, (rws, ids_i, w), combiner) in enumerate(zip(tables, inputs, COMBINERS)):
            got = res[r][f"{backend}_grouped{i}"]
            # DeepRec's shape: one row per sample, zeros where a sample has no ids.
            assert got.shape == (len(dense), table.shape[1])
            np.testing.assert_allclose(got, combine(table, rws, ids_i, w, len(dense), combiner), rtol=1e-5,
                                       atol=1e-6)
            single = res[r][f"{backend}_single{i}"]
            np.testing.assert_allclose(got[:len(single)], single, rtol=1e-6, atol=1e-7)
            assert not got[len(single):].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_lookup_gradients_equal_per_table_gradients(group_run, backend):
    n, res = group_run
    for r in range(n):
        for i in range(len(DIMS)):
            grouped, single = res[r][f"{backend}_grouped_grads{i}"], res[r][f"{backend}_single_grads{i}"]
            np.testing.assert_allclose(grouped, single, rtol=1e-5, atol=1e-6)
        assert any(np.abs(res[r][f"{backend}_grouped_grads{i}"]).sum() > 0 for i in range(len(DIMS)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_columns_in_group_scope_equal_numpy(group_run, backend):
    n, res = group_run
    for r in range(n):
        dense, (rows, ids, weights), _ = cases.local_batch(0, r, n)
        keep = (rows != 1) & (rows != len(dense) - 1)
        expected = np.concatenate([
            combine(cases.table_values(1), rows, ids, np.ones_like(weights), len(dense), "mean"),
            combine(cases.table_values(2), rows[keep], ids[keep], np.ones(keep.sum()), len(dense), "mean")], axis=1)
        np.testing.assert_allclose(res[r][f"{backend}_columns"], expected, rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_the_argument_and_choices():
    import tensorflow as tf

    from collective import group_embedding as ge

    with pytest.raises(ValueError, match="strategy='ps' is not one of collective"):
        ge.enable_distributed_strategy(strategy="ps")
    with tf.Graph().as_default():
        table = tf.compat.v1.get_variable("t", [4, 2])
        sp = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
        with pytest.raises(ValueError, match="partition_strategy='div' is not one of mod"):
            ge.group_embedding_lookup_sparse([table], [sp], ["mean"], partition_strategy="div")
        with pytest.raises(ValueError, match=r"combiners\[0\]='max' is not one of mean, sum, sqrtn"):
            ge.group_embedding_lookup_sparse([table], [sp], ["max"])
        with pytest.raises(ValueError, match="2 combiners for 1 params"):
            ge.group_embedding_lookup_sparse([table], [sp], ["mean", "sum"])
