"""Feature columns on sharded tables equal single-process TensorFlow (1, 2, 3 workers, both backends).

v1 ``input_layer`` with several embedding columns (one weighted), v1
``shared_embedding_columns``, v2 ``shared_embeddings`` and embedding columns
in Keras ``DenseFeatures`` (v2 and v1): lookups, the sharding of their
tables, training through them, and one grouped exchange per input layer.
"""

import numpy as np
import pytest

from workers import columns_cases as cases
from workers import grouped_cases as data
from workers.grouped_runs import grouped_results

BACKENDS = ["hb", "sok", "replicated"]
WORKERS = [1, 2, 3]
PREFIX = "columns:"
# (dimension groups, sharded tables looked up) per case: one exchange per group, not per table.
GROUPS = {"input_layer": (2, 3), "shared_v1": (1, 2), "shared_v2": (1, 2), "dense_features_v2": (2, 3),
          "dense_features_v1": (1, 2)}


@pytest.fixture(scope="module", params=[(b, n) for b in BACKENDS for n in WORKERS],
                ids=lambda p: f"{p[0]}-{p[1]}workers")
def columns_run(request):
    backend, n = request.param
    runs = grouped_results(backend, n)
    return backend, n, [{k[len(PREFIX):]: v for k, v in res.items() if k.startswith(PREFIX)} for res in runs]


@pytest.fixture(scope="module")
def reference():
    return cases.run([cases.global_batch(step) for step in range(data.STEPS)])


@pytest.mark.parametrize("case", cases.CASES)
def test_lookups_equal_single_process_tensorflow(columns_run, reference, case):
    _, n, res = columns_run
    for r in range(n):
        lo, hi = data.local_rows(r, n)
        np.testing.assert_allclose(res[r][f"out_{case}"], reference[f"out_{case}"][lo:hi], rtol=1e-5, atol=1e-6)


def test_tables_are_sharded_and_train_like_one_process(columns_run, reference):
    backend, n, res = columns_run
    names = sorted(k for k in reference if k.startswith("var:"))
    np.testing.assert_allclose(np.mean([res[r]["losses"] for r in range(n)], axis=0), reference["losses"], rtol=1e-5)
    for r in range(n):
        assert sorted(k for k in res[r] if k.startswith("var:")) == names
        for name in names:
            full = reference[name]
            expected = full if name == "var:head" or backend == "replicated" else full[r::n]
            np.testing.assert_allclose(res[r][name], expected, rtol=1e-4, atol=1e-6, err_msg=name)
    assert len(names) == 11  # ten tables and the head


def test_each_input_layer_is_one_grouped_exchange(columns_run):
    backend, n, res = columns_run
    for r in range(n):
        for case, (groups, _tables) in GROUPS.items():
            ops = {k.split("_Horovod")[1]: int(v) for k, v in res[r].items() if k.startswith(f"ops_{case}_Horovod")}
            ops = {k: v for k, v in ops.items() if v}
            if n == 1:
                assert ops == {}, (case, ops)
            elif backend == "hb":
                assert ops == {"Alltoall": 2 * groups}, (case, ops)
            elif backend == "replicated":
                # Whole tables start as rank 0's values (broadcasts); the lookups are one allgather of sizes
                # and one of ids per group.
                assert ops.pop("Broadcast", 0) >= 1, (case, ops)
                assert ops == {"Allgather": 2 * groups}, (case, ops)
            else:
                assert ops == {"Allgather": 1, "Alltoall": 1}, (case, ops)
