"""Grouped (coalesced) lookups of several sharded tables on 1, 2 and 3 workers, both backends.

Lookups are compared with numpy on the full tables and with the per-table
path; training through a grouped lookup with plain single-process TensorFlow
on the whole global batch; the graph is checked for one exchange per group.
"""

import numpy as np
import pytest

from test_embedding import combine
from launcher import held
from workers import grouped_cases as cases
from workers.grouped_runs import grouped_results

BACKENDS = ["hb", "sok", "replicated"]
WORKERS = [1, 2, 3]


@pytest.fixture(scope="module", params=[(b, n) for b in BACKENDS for n in WORKERS],
                ids=lambda p: f"{p[0]}-{p[1]}workers")
def grouped_run(request):
    backend, n = request.param
    return backend, n, grouped_results(backend, n)


@pytest.fixture(scope="module")
def reference_training():
    return cases.train([cases.global_batch(step) for step in range(cases.STEPS)])


def test_grouped_lookups_equal_numpy_and_the_per_table_path(grouped_run):
    backend, n, res = grouped_run
    for r in range(n):
        features, _ = cases.local_batch(0, r, n)
        for i, ((rows, ids, weights), (_, vocab, dim, combiner, weighted)) in enumerate(zip(features, cases.TABLES)):
            full = cases.table_values(i, vocab, dim)
            w = weights if weighted else np.ones_like(weights)
            expected = combine(full, rows, ids, w, cases.BATCH // n, combiner)
            np.testing.assert_allclose(res[r][f"grouped_{i}"], expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(res[r][f"ungrouped_{i}"], expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(res[r][f"grouped_shard_{i}"], held(full, backend, r, n))


def test_weights_get_their_gradient_through_grouped_and_single_lookups(grouped_run):
    """Regression: the grouped sok exchange sent the weights as bits in its allgather and gave them no gradient."""
    _, n, res = grouped_run
    for r in range(n):
        features, _ = cases.local_batch(0, r, n)
        expected = cases.reference_weight_gradients(features, cases.BATCH // n)
        assert sorted(expected) == [1, 2]
        for i, grad in expected.items():
            np.testing.assert_allclose(res[r][f"grouped_wgrad_{i}"], grad, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(res[r][f"ungrouped_wgrad_{i}"], grad, rtol=1e-5, atol=1e-6)


def test_pad_to_batch_gives_every_sample_a_row(grouped_run):
    _, n, res = grouped_run
    batch = cases.BATCH // n
    for r in range(n):
        features, _ = cases.local_batch(0, r, n)
        for i, ((rows, ids, weights), (_, vocab, dim, combiner, weighted)) in enumerate(zip(features, cases.TABLES)):
            keep = rows < batch - 1
            w = weights[keep] if weighted else np.ones(keep.sum(), np.float32)
            expected = combine(cases.table_values(i, vocab, dim), rows[keep], ids[keep], w, batch, combiner)
            assert res[r][f"padded_{i}"].shape == (batch, dim)
            np.testing.assert_allclose(res[r][f"padded_{i}"], expected, rtol=1e-5, atol=1e-6)
            assert not res[r][f"padded_{i}"][-1].any()


def test_one_exchange_per_group(grouped_run):
    backend, n, res = grouped_run
    for r in range(n):
        ops = {k[len("grouped_ops_"):]: int(v) for k, v in res[r].items() if k.startswith("grouped_ops_")}
        ungrouped = {k[len("ungrouped_ops_"):]: int(v) for k, v in res[r].items() if k.startswith("ungrouped_ops_")}
        if n == 1:
            assert ops == {} and ungrouped == {}
        elif backend == "hb":
            # Two dimension groups (4 and 3): an id and a vector alltoall each; per table it would be 2 * 4.
            assert ops == {"HorovodAlltoall": 4}, ops
            assert ungrouped == {"HorovodAlltoall": 8}, ungrouped
        elif backend == "replicated":
            # Per dimension group the sizes and the ids are allgathered; per table it would be 2 * 4.
            # Each of the 4 tables starts as rank 0's value: one broadcast each.
            assert ops == {"HorovodAllgather": 4, "HorovodBroadcast": 4}, ops
            assert ungrouped == {"HorovodAllgather": 8, "HorovodBroadcast": 4}, ungrouped
        else:
            # (id, sample, weight) for every table in one allgather, the partial sums of all dims in one alltoall.
            # One table alone is a group of one: the same allgather and alltoall.
            assert ops == {"HorovodAllgather": 1, "HorovodAlltoall": 1}, ops
            assert ungrouped == {"HorovodAllgather": 4, "HorovodAlltoall": 4}, ungrouped
        if n > 1:
            assert res[r]["grouped_bytes"] > 0


def test_training_through_a_grouped_lookup_matches_one_process(grouped_run, reference_training):
    backend, n, res = grouped_run
    losses, tables, w = reference_training
    np.testing.assert_allclose(np.mean([res[r]["train_losses"] for r in range(n)], axis=0), losses, rtol=1e-5)
    for r in range(n):
        for i, table in enumerate(tables):
            np.testing.assert_allclose(res[r][f"train_table_{i}"], held(table, backend, r, n), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(res[r]["train_w"], w, rtol=1e-4, atol=1e-6)
    assert not np.allclose(tables[0], cases.table_values(0, *tables[0].shape))


@pytest.mark.parametrize("n", WORKERS)
def test_packed_hb_lookups_equal_the_unpacked_ones_with_one_unique_per_pack(n):
    """docs/packing.md stage 1 (COLLECTIVE_PACKING=1, served by hb's exchange and at world size 1): ta, tb and
    td (dim 4, sum) share one unique and one combine; tc (dim 3) is alone. Values and table gradients are
    bitwise the unpacked path's. Reads the hb results of the grouped launch the other tests share."""
    res = grouped_results("hb", n)
    for r in range(n):
        features, _ = cases.local_batch(0, r, n)
        for i, ((rows, ids, _), (_, vocab, dim, _, _)) in enumerate(zip(features, cases.TABLES)):
            expected = combine(cases.table_values(i, vocab, dim), rows, ids, np.ones(ids.size, np.float32),
                               cases.BATCH // n, "sum")
            np.testing.assert_allclose(res[r][f"packed:unpacked_{i}"], expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(res[r][f"packed:packed_{i}"], res[r][f"packed:unpacked_{i}"])
            np.testing.assert_array_equal(res[r][f"packed:packed_grad_{i}"], res[r][f"packed:unpacked_grad_{i}"])
            assert res[r][f"packed:unpacked_grad_{i}"].any()
        assert (int(res[r]["packed:unpacked_uniques"]), int(res[r]["packed:packed_uniques"])) == (4, 2)
