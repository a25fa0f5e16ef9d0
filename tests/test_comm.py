"""collective.comm on 1, 2 and 3 workers started by the launcher, against numpy."""

import numpy as np
import pytest

from launcher import load_rank_results, run_workers
from workers import comm_cases as cases

DIM = cases.DIM


def expected_alltoall(n, dtype):
    """What each rank receives, and the gradient each rank's input gets."""
    received, offsets = [], []
    for r in range(n):
        parts, offs, at = [], {}, 0
        for j in range(n):
            sp = cases.splits(j, n)
            start = int(sp[:r].sum())
            rows = cases.alltoall_input(j, n, dtype)[start:start + sp[r]]
            offs[j] = at
            at += sp[r]
            parts.append(rows)
        received.append(np.concatenate(parts))
        offsets.append(offs)
    grads = []
    for r in range(n):
        sp = cases.splits(r, n)
        pieces = []
        for j in range(n):
            w = cases.upstream(j, (64, DIM))
            pieces.append(w[offsets[j][r]:offsets[j][r] + sp[j]])
        grads.append(np.concatenate(pieces))
    return received, grads


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"{n}workers")
def comm_results(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"comm{n}")
    run_workers("comm_worker.py", n, [out])
    return n, load_rank_results(out, n)


def test_allreduce(comm_results):
    n, res = comm_results
    total = sum(cases.dense(k) for k in range(n))
    up_total = sum(cases.upstream(k, (2, DIM)) for k in range(n))
    for r in range(n):
        np.testing.assert_allclose(res[r]["allreduce_sum"], total, rtol=1e-6)
        np.testing.assert_allclose(res[r]["allreduce_average"], total / n, rtol=1e-6)
        np.testing.assert_allclose(res[r]["allreduce_sum_grad"], up_total, rtol=1e-6)
        np.testing.assert_allclose(res[r]["allreduce_average_grad"], up_total / n, rtol=1e-6)


def test_grouped_allreduce_float32_and_float16(comm_results):
    n, res = comm_results
    up_total = sum(cases.upstream(k, (2, DIM)) for k in range(n))
    for r in range(n):
        np.testing.assert_allclose(res[r]["grouped_f32"], sum(cases.dense(k) for k in range(n)), rtol=1e-6)
        assert res[r]["grouped_f16"].dtype == np.float16
        np.testing.assert_allclose(res[r]["grouped_f16"].astype(np.float32),
                                   sum(cases.dense(k, np.float16).astype(np.float32) for k in range(n)), rtol=1e-3)
        np.testing.assert_allclose(res[r]["grouped_f32_grad"], up_total, rtol=1e-6)
        np.testing.assert_allclose(res[r]["grouped_f16_grad"].astype(np.float32), up_total, rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_allgather_uneven_and_empty(comm_results, dtype):
    n, res = comm_results
    name = np.dtype(dtype).name
    gathered = np.concatenate([cases.gather_input(k, dtype) for k in range(n)])
    total = gathered.shape[0]
    up_total = sum(cases.upstream(k, (total, DIM)) for k in range(n))
    start = 0
    for r in range(n):
        rows = cases.gather_rows(r)
        assert res[r][f"allgather_{name}"].dtype == dtype
        np.testing.assert_array_equal(res[r][f"allgather_{name}"], gathered)
        np.testing.assert_allclose(res[r][f"allgather_{name}_grad"], up_total[start:start + rows], rtol=1e-3)
        start += rows
        np.testing.assert_array_equal(res[r]["allgather_ids"], np.concatenate([cases.gather_ids(k) for k in range(n)]))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_alltoall_uneven_and_empty_splits(comm_results, dtype):
    n, res = comm_results
    name = np.dtype(dtype).name
    received, grads = expected_alltoall(n, dtype)
    for r in range(n):
        np.testing.assert_array_equal(res[r][f"alltoall_{name}"], received[r])
        np.testing.assert_array_equal(res[r][f"alltoall_{name}_received"], [cases.splits(j, n)[r] for j in range(n)])
        np.testing.assert_allclose(res[r][f"alltoall_{name}_grad"], grads[r], rtol=1e-3)


def test_alltoall_int64_ids(comm_results):
    n, res = comm_results
    for r in range(n):
        parts = []
        for j in range(n):
            sp = cases.splits(j, n)
            start = int(sp[:r].sum())
            parts.append(cases.alltoall_ids(j, n)[start:start + sp[r]])
        assert res[r]["alltoall_ids"].dtype == np.int64
        np.testing.assert_array_equal(res[r]["alltoall_ids"], np.concatenate(parts))


def test_broadcast(comm_results):
    n, res = comm_results
    for r in range(n):
        np.testing.assert_array_equal(res[r]["broadcast_0"], cases.dense(0))
        np.testing.assert_array_equal(res[r]["broadcast_last"], cases.dense(n - 1))


def test_broadcast_string_gives_the_roots_text(comm_results):
    n, res = comm_results
    for r in range(n):
        assert res[r]["broadcast_strings"].tolist() == [cases.text(0), cases.text(n - 1), "", cases.text(0)]


def test_bytes_counter_counts_what_each_worker_sends(comm_results):
    n, res = comm_results
    for r in range(n):
        sp = cases.splits(r, n)
        alltoall_bytes = (int(sp.sum()) - int(sp[r])) * DIM * 4
        allgather_bytes = cases.gather_rows(r) * DIM * 4 * (n - 1)
        assert int(res[r]["bytes_two_runs"]) == 2 * (alltoall_bytes + allgather_bytes)
