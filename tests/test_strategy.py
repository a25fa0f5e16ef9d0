"""CollectiveStrategy's surface: the reference example, bad input, backend choice, scope hygiene."""

import re
import time

import numpy as np
import pytest

from launcher import run_workers


# Every entry point, backend and N refuses bad ids in tests/test_matrix.py; these two launches check that bad
# ids on one worker only stop the whole job quickly.
@pytest.mark.parametrize("backend, mode, bad", [("hb", "negative", "-3"), ("sok", "too_large", "10")])
def test_out_of_range_ids_name_the_table_and_stop_the_job(backend, mode, bad):
    start = time.monotonic()
    proc = run_workers("bad_input.py", 2, [mode, backend], check=False, timeout=120)
    assert proc.returncode != 0
    assert "embedding table user_table has 10 rows but got ids outside [0, 10)" in proc.stderr
    extremes = re.search(r"Smallest and largest id of the batch:\] \[(-?\d+)\] \[(-?\d+)\]", proc.stderr)
    assert extremes is not None and bad in extremes.groups(), proc.stderr[-3000:]
    assert time.monotonic() - start < 90


@pytest.mark.parametrize("backend", ["hb", "sok"])
def test_empty_batch_on_one_worker_does_not_hang(backend):
    proc = run_workers("bad_input.py", 3, ["empty", backend], timeout=120)
    assert "[2] rank 2 dense (0, 2) sparse (0, 2) sum 0.0" in proc.stdout
    assert "[0] rank 0 dense (3, 2) sparse (3, 2) sum 6.0" in proc.stdout


def test_unknown_backend_lists_the_choices():
    from collective import CollectiveStrategy, UnknownBackendError

    with pytest.raises(UnknownBackendError, match="backend 'nccl' is not one of hb, sok"):
        CollectiveStrategy("nccl")


def test_scope_restores_tensorflow_exactly():
    import tensorflow as tf

    from collective import CollectiveStrategy
    from collective.tf_internals import embedding_ops, patches, variable_v1, variables
    from collective.tf_internals import optimizer_lib as optimizer

    watched = [(embedding_ops, "embedding_lookup"), (embedding_ops, "embedding_lookup_sparse_impl"),
               (tf.compat.v1.nn, "embedding_lookup"), (variable_v1, "default_variable_creator"),
               (variables, "default_variable_creator_v2")]
    before = [getattr(m, a) for m, a in watched] + [optimizer.Optimizer.__dict__["apply_gradients"]]
    strategy = CollectiveStrategy()
    with strategy.scope():
        with strategy.scope():
            inside = [getattr(m, a) for m, a in watched] + [optimizer.Optimizer.__dict__["apply_gradients"]]
        assert patches.active()
    after = [getattr(m, a) for m, a in watched] + [optimizer.Optimizer.__dict__["apply_gradients"]]
    assert all(x is not y for x, y in zip(before, inside))
    assert all(x is y for x, y in zip(before, after))
    assert not patches.active()
    np.testing.assert_equal(len(before), 6)
