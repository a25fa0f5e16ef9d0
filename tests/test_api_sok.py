"""collective.sok (SparseOperationKit's API): the get-started recipes on 1, 2 and 3 workers.

The TF2 Horovod recipe (eager + tf.function) and the TF 1.15 recipe (graph,
Session) train SOK's DemoModel for 20 steps; one plain TensorFlow process
trains the same model with ``tf.nn.embedding_lookup`` on every global batch,
and losses, the table and the dense weights are compared.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from launcher import load_rank_results, run_workers

sys.path.insert(0, str(pathlib.Path(__file__).parent / "workers"))
from workers import api_sok_cases as cases  # noqa: E402

# (script, workers, optimizer): every worker count, every embedding optimizer, one launch each.
RUNS = [("api_sok_tf2.py", 1, "sok_adam"), ("api_sok_tf2.py", 2, "keras_adam"), ("api_sok_tf2.py", 3, "lazy_adam"),
        ("api_sok_tf1.py", 3, "legacy_adam")]


@pytest.fixture(scope="module", params=RUNS, ids=lambda p: f"{p[0][8:11]}-{p[1]}workers-{p[2]}")
def recipe_run(request, tmp_path_factory):
    script, n, which = request.param
    out = tmp_path_factory.mktemp(f"sok-{n}-{which}")
    run_workers(script, n, [out, which], timeout=900)
    return script, n, which, out


def test_demo_model_trains_like_one_process(recipe_run):
    script, n, which, out = recipe_run
    res = load_rank_results(out, n)
    losses, table, dense = cases.reference_training(n, "keras_adam" if which == "sok_adam" else which)
    # The recipe prints the average of the workers' losses; each is a part of the global mean.
    np.testing.assert_allclose(res[0]["losses"] * n, losses, rtol=1e-4)
    for r in range(n):
        for name, got, expected in ([("table", res[r]["shard"], table[r::n])]
                                    + [(f"dense{i}", res[r][f"dense{i}"], v) for i, v in enumerate(dense)]):
            # Adam moves a weight by about the learning rate whatever the size of its gradient, so the few
            # weights whose gradient is float noise drift apart by a step or so; all others agree to ~1e-6
            # (measured: mean difference <= 5e-6, at most 0.2% of elements off by more than 1e-4).
            diff = np.abs(got - expected)
            assert diff.mean() < 1e-5, (script, r, name, diff.mean())
            assert (diff > 1e-4).mean() < 5e-3, (script, r, name, (diff > 1e-4).mean())
    assert np.abs(table - cases.table_values()[:len(table)]).max() > 1e-2, "training did not move the table"


def test_sok_layers_equal_numpy_eagerly_and_in_tf_function(recipe_run):
    script, n, _, out = recipe_run
    if script != "api_sok_tf2.py":
        pytest.skip("the lookup cases run in the TF2 script only")
    table = cases.table_values()[:1024 * n]
    for r in range(n):
        with np.load(out / f"lookups{r}.npz") as data:
            got = dict(data)
        keys, _ = cases.local_batch(0, r, n)
        for combiner in ("Mean", "sum"):
            expected = cases.combine_numpy(table, keys, combiner.lower())
            for mode in ("eager", "function"):
                np.testing.assert_allclose(got[f"distributed_{combiner}_{mode}"], expected, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got["dynamic"], table[got["dynamic_keys"]], rtol=1e-6)


def test_lazy_adam_updates_only_touched_rows():
    import collective.sok as sok

    start = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    var = tf.Variable(start)
    opt = sok.LazyAdamOptimizer(learning_rate=0.1)
    grads = [tf.IndexedSlices(tf.constant([[1.0, -2.0], [0.5, 0.5], [3.0, 1.0]]), tf.constant([1, 4, 1])),
             tf.IndexedSlices(tf.constant([[2.0, 2.0]]), tf.constant([4]))]
    m, v, expected = np.zeros_like(start), np.zeros_like(start), start.copy()
    for t, grad in enumerate(grads, 1):
        opt.apply_gradients([(grad, var)])
        dense = np.zeros_like(start)
        np.add.at(dense, grad.indices.numpy(), grad.values.numpy())
        rows = np.unique(grad.indices.numpy())
        m[rows] = 0.9 * m[rows] + 0.1 * dense[rows]
        v[rows] = 0.999 * v[rows] + 0.001 * dense[rows] ** 2
        alpha = 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        expected[rows] -= alpha * m[rows] / (np.sqrt(v[rows]) + 1e-7)
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-5)
    np.testing.assert_array_equal(var.numpy()[[0, 2, 3, 5]], start[[0, 2, 3, 5]])


@pytest.mark.parametrize("make", [tf.distribute.MirroredStrategy, tf.distribute.OneDeviceStrategy])
def test_tf_distribute_strategies_are_refused_with_advice(make):
    import collective.sok as sok

    strategy = make() if make is tf.distribute.MirroredStrategy else make("/cpu:0")
    with strategy.scope():
        with pytest.raises(sok.UnsupportedStrategyError, match="Use Horovod.*python -m collective.launch"):
            sok.Init(global_batch_size=8)
        with pytest.raises(sok.UnsupportedStrategyError, match=type(strategy).__name__):
            sok.All2AllDenseEmbedding(8, 4, slot_num=1, nnz_per_slot=1, use_hashtable=False)


def test_bad_arguments_name_the_argument_and_choices():
    import collective.sok as sok

    with pytest.raises(ValueError, match="combiner='max' is not one of mean, sum"):
        sok.DistributedEmbedding("max", 8, 4, slot_num=1, max_nnz=2, use_hashtable=False)
    with pytest.raises(ValueError, match="max_vocabulary_size_per_gpu=0"):
        sok.All2AllDenseEmbedding(0, 4, slot_num=1, nnz_per_slot=1, use_hashtable=False)
    with pytest.raises(TypeError, match="unsupported argument.*ps_num.*global_batch_size"):
        sok.Init(global_batch_size=8, ps_num=2)
    with pytest.raises(ValueError, match="use_hashtable=True needs graph mode"):
        sok.All2AllDenseEmbedding(8, 4, slot_num=1, nnz_per_slot=1)
    with pytest.raises(ValueError, match="OptimizerScope takes embedding variables only"):
        sok.OptimizerScope([tf.Variable([1.0], name="dense_bias")])
    layer = sok.All2AllDenseEmbedding(8, 4, slot_num=1, nnz_per_slot=1, use_hashtable=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ids outside"):
        layer(tf.constant([[[9]]], tf.int64))
    embedding, others = sok.split_embedding_variable_from_others([tf.Variable(1.0)] + layer.trainable_variables)
    assert len(embedding) == 1 and len(others) == 1 and embedding[0] is layer.embedding_variable
