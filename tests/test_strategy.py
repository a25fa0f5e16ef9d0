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
    # The plan: logged once, by rank 0, as one block; a rank that made another table is refused, naming it.
    logged = [line for line in proc.stderr.splitlines() if "sharding plan: 1 table(s) on 3 worker(s)" in line]
    assert len(logged) == 2 and all(line.startswith("[0]") for line in logged), proc.stderr[-3000:]  # two plans
    assert re.search(r"\[0\].*user_table +10 +2 +32 +row_wise +" + backend + r" +0-2", proc.stderr), proc.stderr[-3000:]
    assert "[0] rank 0 agrees" in proc.stdout and "[1] rank 1 agrees" in proc.stdout
    assert "[2] rank 2 refused: rank 2 holds another sharding plan than rank 0 for table(s) 'only_here'" in proc.stdout


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


def test_sharding_overrides_reach_every_face_and_a_bad_one_is_refused_naming_the_table(tmp_path, monkeypatch):
    """One process (placements are N-free here): getters, Keras layers, hash tables and sok.Variable all place
    their tables through the strategy's plan; the planner's rules are tested in tests/test_sharding_plan.py."""
    import tensorflow as tf

    from collective import CollectiveStrategy, sok
    from collective.embedding import hash_table
    from collective.embedding.table import shard_of
    from collective.sharding import PlanError, ShardingPlan

    strategy = CollectiveStrategy(sharding={"scope/user": "replicated", "embedding/embeddings": "replicated"})
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope(), tf.compat.v1.variable_scope("scope"):
            user = tf.compat.v1.get_variable("user", [6, 2])
            item = tf.compat.v1.get_variable("item", [6, 2])
        with strategy.embedding_scope():
            layer = tf.keras.layers.Embedding(5, 3)
            layer(tf.constant([[1]]))
        keys = hash_table.hash_embedding_variable("keys", 4, 16)
        sok_var = sok.Variable(shape=[8, 2], name="sok_table")
    assert shard_of(user).replicated and not shard_of(item).replicated and shard_of(layer.embeddings).replicated
    assert [(t.name, t.placement, t.key_space) for t in strategy.plan.values()] == [
        ("scope/user", "replicated", "dense"), ("scope/item", "row_wise", "dense"),
        ("embedding/embeddings", "replicated", "dense"), (shard_of(keys).name, "row_wise", "hash"),
        (sok_var.name.split(":")[0], "row_wise", "dense")]
    assert strategy.announce_plan() is strategy.plan

    by_call = CollectiveStrategy(sharding=lambda t: "replicated" if t.name.endswith("user") else None)
    with by_call.scope(), tf.Graph().as_default(), by_call.embedding_scope():
        assert shard_of(tf.compat.v1.get_variable("user", [6, 2])).replicated

    # A model_fn's own CollectiveStrategy().embedding_scope() (the model zoo's, DeepRec's) inside the scope of a
    # strategy given overrides places its tables in that strategy's plan, under its overrides.
    with by_call.scope(), tf.Graph().as_default(), CollectiveStrategy().embedding_scope():
        assert shard_of(tf.compat.v1.get_variable("inner/user", [6, 2])).replicated
    assert by_call.plan["inner/user"].placement == "replicated"

    written = tmp_path / "plan.json"
    written.write_text(strategy.plan.to_json())
    monkeypatch.setenv("COLLECTIVE_SHARDING", str(written))
    from_env = CollectiveStrategy()
    with from_env.scope(), tf.Graph().as_default(), from_env.embedding_scope(), tf.compat.v1.variable_scope("scope"):
        assert shard_of(tf.compat.v1.get_variable("user", [6, 2])).replicated
    assert isinstance(from_env.plan, ShardingPlan) and from_env.plan["scope/user"].reason == "chosen by the user"
    monkeypatch.delenv("COLLECTIVE_SHARDING")

    with pytest.raises(PlanError, match="table 'sok_wide': placement 'column_wise' is not built for a SOK table"):
        bad = CollectiveStrategy(sharding={"sok_wide": "column_wise"})
        with bad.scope(), tf.Graph().as_default():
            sok.Variable(shape=[8, 2], name="sok_wide")
    with pytest.raises(PlanError, match="table 'nope': unknown placement 'upside_down'"):
        CollectiveStrategy(sharding={"nope": "upside_down"})
    typo = CollectiveStrategy(sharding={"scope/usr": "replicated"})
    with typo.scope(), tf.Graph().as_default(), typo.embedding_scope():
        tf.compat.v1.get_variable("user", [6, 2])
    with pytest.raises(PlanError, match="names table\\(s\\) 'scope/usr' that the model does not make"):
        typo.announce_plan()


@pytest.mark.parametrize("face", ["get_variable", "keras_embedding"])
def test_a_constraint_on_a_column_wise_table_is_refused_naming_it(face):
    """One process (column_wise holds on one worker too): a constraint would see each worker's slice of a row,
    so it is refused when the table is made, naming the table; the same table row_wise keeps its constraint."""
    import tensorflow as tf

    from collective import CollectiveStrategy
    from collective.sharding import PlanError

    max_norm = tf.keras.constraints.MaxNorm(1.0, axis=1)

    def make(strategy):
        with strategy.scope(), tf.Graph().as_default(), strategy.embedding_scope():
            if face == "get_variable":
                return tf.compat.v1.get_variable("wide", [6, 4], constraint=max_norm)
            layer = tf.keras.layers.Embedding(6, 4, embeddings_constraint=max_norm, name="wide")
            layer(tf.constant([[1]]))
            return layer.embeddings

    name = "wide" if face == "get_variable" else "wide/embeddings"
    assert make(CollectiveStrategy(sharding={name: "row_wise"})).constraint is max_norm
    with pytest.raises(PlanError, match=f"table '{name}': placement 'column_wise' cannot apply its constraint="):
        make(CollectiveStrategy(sharding={name: "column_wise"}))
