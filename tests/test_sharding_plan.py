"""The sharding plan and its planner, in-process (no launch, no TensorFlow graph): against hand-computed plans."""

from __future__ import annotations

import json
import logging

import pytest

from collective.context import Context
from collective.sharding import runtime
from collective.sharding.plan import PlanError, ShardingPlan, TablePlan
from collective.sharding.planner import CostModel, TableSpec, World, exchange_for, plan

EVERY = (0, 1, 2)


def _table(name, rows, dim, placement, exchange, ranks=EVERY, reason="", key_space="dense"):
    return TablePlan(name, (rows, dim), "float32", key_space, placement, exchange, ranks, "", reason)


SPECS = [TableSpec("user", 10, 4), TableSpec("tiny", 2, 4), TableSpec("small", 5, 2),
         TableSpec("keys", 30, 8, key_space="hash"), TableSpec("sok_table", 100, 8, api="sok")]


def test_defaults_are_the_rules_each_api_followed():
    got = plan(SPECS, World(3), cost=CostModel(replicate_below_bytes=41))
    assert list(got.values()) == [
        _table("user", 10, 4, "row_wise", "hb", reason="default: row i on rank i % N"),
        _table("tiny", 2, 4, "replicated", "allreduce",
               reason="fewer rows (2) than workers (3): an ordinary variable, averaged like a dense layer"),
        _table("small", 5, 2, "replicated", "replicated", reason="40 bytes, below replicate_below_bytes=41"),
        _table("keys", 30, 8, "row_wise", "hb", reason="hash table: key k on rank k % N", key_space="hash"),
        _table("sok_table", 100, 8, "row_wise", "hb", reason="SOK's layout: row i on rank i % N")]
    assert got.world_size == 3


def test_the_replicated_backend_replicates_dense_tables_and_hb_serves_the_rest():
    got = plan(SPECS, World(2), backend="replicated")
    assert [(t.placement, t.exchange) for t in got.values()] == [
        ("replicated", "replicated"), ("replicated", "replicated"), ("replicated", "replicated"),
        ("row_wise", "hb"), ("row_wise", "hb")]
    assert exchange_for("row_wise", "sok") == "sok" and exchange_for("replicated", "sok") == "replicated"


def test_overrides_by_name_and_by_callable():
    by_name = plan(SPECS, World(3), {"user": "replicated"}, backend="sok")
    assert by_name["user"] == _table("user", 10, 4, "replicated", "replicated", reason="chosen by the user")
    assert by_name["small"].placement == "row_wise" and by_name["small"].exchange == "sok"
    by_call = plan(SPECS, World(3), lambda t: "replicated" if t.key_space == "dense" and t.rows >= 3
                   and t.name != "sok_table" else None)
    assert [t.placement for t in by_call.values()] == ["replicated", "replicated", "replicated", "row_wise",
                                                       "row_wise"]


@pytest.mark.parametrize("overrides, message", [
    ({"keys": "column_wise"}, "table 'keys': placement 'column_wise' cannot hold a hash table"),
    ({"keys": "replicated"}, "table 'keys': placement 'replicated' cannot hold a hash table"),
    ({"user": "diagonal"}, "table 'user': unknown placement 'diagonal'"),
    ({"nobody": "row_wise"}, "names table(s) 'nobody' that the model does not make"),
    ({"small": "column_wise"}, "table 'small': placement 'column_wise' needs at least one column per worker: "
                               "dim 2 on 3 workers"),
    ({"sok_table": "column_wise"}, "table 'sok_table': placement 'column_wise' is not built for a SOK table yet"),
    ({"sok_table": "replicated"}, "table 'sok_table': placement 'replicated' is not built for a SOK table yet"),
    ({"sok_keys": "table_wise"}, "table 'sok_keys': placement 'table_wise' is not built for a SOK table yet; a SOK "
                                 "table can be row_wise"),
    ({"tiny": "row_wise"}, "table 'tiny': placement 'row_wise' needs at least one row per worker"),
    ({"user": "table_wise"}, "table 'user': placement 'table_wise' puts the whole table (160 bytes) on one "
                             "worker, more than the 100 bytes"),
    ({"user": "replicated"}, "table 'user': placement 'replicated' puts the whole table (160 bytes) on one "
                             "worker, more than the 100 bytes"),
])
def test_an_override_that_cannot_hold_is_refused_naming_the_table(overrides, message):
    memory = 100 if "bytes" in message else None
    specs = SPECS + [TableSpec("sok_keys", 30, 8, key_space="hash", api="sok")]
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(specs, World(3, memory_per_worker=memory), overrides)


def test_a_hash_table_goes_whole_to_the_least_loaded_rank():
    """``table_wise`` on hash tables: the whole capacity (every worker's) on one rank, spread like dense tables."""
    specs = [TableSpec("user", 100, 8), TableSpec("keys", 30, 8, key_space="hash"),
             TableSpec("more_keys", 30, 8, key_space="hash")]
    got = plan(specs, World(3), {"user": "table_wise", "keys": "table_wise", "more_keys": "table_wise"},
               backend="sok")
    assert got["keys"] == _table("keys", 30, 8, "table_wise", "sok", (1,), "chosen by the user", "hash")
    assert got["more_keys"].ranks == (2,) and got["keys"].bytes_per_worker == 30 * 8 * 4
    with pytest.raises(PlanError, match="table 'keys': placement 'table_wise' puts the whole table \\(960 bytes\\)"):
        plan(specs[1:2], World(3, memory_per_worker=900), {"keys": "table_wise"})


def test_a_partial_plan_waits_for_the_names_it_does_not_know_yet():
    assert plan(SPECS[:1], World(3), {"keys": "row_wise"}, partial=True)["user"].placement == "row_wise"


def test_a_plan_reads_back_and_its_fingerprint_follows_placements_not_reasons():
    got = plan(SPECS, World(3), {"user": "replicated"})
    back = ShardingPlan.from_json(got.to_json())
    assert back == got and back.fingerprint() == got.fingerprint()
    assert json.loads(got.to_json())["tables"][0]["placement"] == "replicated"
    reworded = ShardingPlan([TablePlan(**{**t.to_dict(), "shape": t.shape, "ranks": t.ranks, "reason": "x"})
                             for t in got.values()], 3)
    assert reworded.fingerprint() == got.fingerprint()
    other = plan(SPECS, World(3))
    assert other.fingerprint() != got.fingerprint() and got.differing(other) == ["user"]
    assert plan(SPECS, World(2)).fingerprint() != other.fingerprint()
    with pytest.raises(PlanError, match="format"):
        ShardingPlan.from_json('{"tables": []}')


def test_a_plan_as_overrides_gives_the_same_plan():
    chosen = plan(SPECS, World(3), {"user": "replicated", "small": "replicated"})
    again = plan(SPECS, World(3), ShardingPlan.from_json(chosen.to_json()))
    assert [(t.placement, t.exchange, t.ranks) for t in again.values()] == \
        [(t.placement, t.exchange, t.ranks) for t in chosen.values()]


def test_str_prints_one_table_with_every_column():
    text = str(plan(SPECS[:2], World(3)))
    lines = text.splitlines()
    assert lines[0].startswith("sharding plan: 2 table(s) on 3 worker(s), fingerprint ")
    assert lines[1].split() == ["table", "rows", "dim", "bytes/worker", "placement", "exchange", "ranks", "reason"]
    assert lines[2].split()[:7] == ["user", "10", "4", "64", "row_wise", "hb", "0-2"]  # ceil(10 / 3) * 4 * 4 bytes
    assert lines[3].split()[:7] == ["tiny", "2", "4", "32", "replicated", "allreduce", "0-2"]


def test_cost_model_bytes_per_step():
    cost = CostModel(global_batch_size=100, ids_per_sample=2.0)
    spec = TableSpec("t", 1000, 4)  # a row is 16 bytes; 200 lookups per step
    assert cost.bytes_per_step(spec, "row_wise", 4) == 200 * (8 + 32) * 3 / 4
    assert cost.bytes_per_step(spec, "replicated", 4) == 200 * (8 + 16) * 3
    assert cost.bytes_per_step(spec, "row_wise", 1) == 0


def _planning(world_size=3, rank=0, overrides=None):
    return runtime.Planning(Context(rank=rank, world_size=world_size), overrides)


def test_planning_places_tables_as_they_are_made_and_follows_their_graph_names():
    planning = _planning(overrides={"scope/user": "replicated"})
    assert planning.place(TableSpec("user", 10, 4)).placement == "row_wise"
    planning.rename("user", "scope/user")  # renamed after the placement: the plan follows, the override is checked
    assert list(planning.plan) == ["scope/user"]
    assert planning.place(TableSpec("scope/user", 10, 4)).placement == "replicated"  # made again in a new graph
    assert len(planning.plan) == 1
    # Made again, a table keeps its place: the table-wise tables after it keep their ranks.
    spread = _planning(overrides={"a": "table_wise", "b": "table_wise"})
    assert [spread.place(TableSpec(name, 10, 4)).ranks for name in ("a", "b", "a", "b")] == [(0,), (1,), (0,), (1,)]
    with pytest.raises(PlanError, match="unknown placement 'sideways'"):
        _planning(overrides={"a": "sideways"})
    with pytest.raises(PlanError, match="'ghost' that the model does not make"):
        runtime.announce(_planning(overrides={"ghost": "row_wise"}))


def test_overrides_from_the_environment(tmp_path):
    written = plan(SPECS[:1], World(3), {"user": "replicated"})
    path = tmp_path / "plan.json"
    path.write_text(written.to_json())
    assert runtime.overrides_from_env({runtime.ENV: str(path)}) == written
    assert runtime.overrides_from_env({}) is None
    with pytest.raises(PlanError, match="cannot read it"):
        runtime.overrides_from_env({runtime.ENV: str(tmp_path / "missing.json")})


def test_ranks_agree_or_the_ones_that_differ_are_named(caplog):
    rank0, rank1 = _planning(rank=0), _planning(rank=1)
    for planning in (rank0, rank1):
        planning.place(TableSpec("a", 10, 4))
    rank1.place(TableSpec("b", 10, 8))
    rank0.place(TableSpec("b", 10, 4))
    sent = {}

    def broadcast(text):  # rank 0's text, as comm.broadcast_string gives it
        return sent.setdefault("rank0", text)

    with caplog.at_level(logging.INFO, logger="collective.sharding"):
        runtime.announce(rank0, broadcast)
    assert [r.getMessage() for r in caplog.records] == [str(rank0.plan)]
    with pytest.raises(runtime.PlanMismatchError, match=r"rank 1 holds another sharding plan than rank 0 for "
                                                        r"table\(s\) 'b'"):
        runtime.announce(rank1, broadcast)


def test_table_wise_tables_go_to_the_least_loaded_rank_with_room():
    specs = [TableSpec("big", 100, 8), TableSpec("mid", 60, 8), TableSpec("small", 10, 8, ids_per_sample=30.0),
             TableSpec("rest", 50, 8)]
    every = {s.name: "table_wise" for s in specs}
    # By bytes (no batch size): 3,200 -> rank 0, 1,920 -> rank 1, 320 -> rank 2, then 1,600 -> rank 2 (least).
    by_bytes = plan(specs, World(3), every)
    assert [t.ranks for t in by_bytes.values()] == [(0,), (1,), (2,), (2,)]
    assert by_bytes["big"].bytes_per_worker == 3200 and by_bytes["big"].exchange == "hb"
    # Two ranks, "small" made second. By bytes: 3,200 -> 0; 320 -> 1; 1,920 -> 1 (2,240); 1,600 -> 1 (3,840).
    # By bytes per step (batch 10, 72 bytes a lookup, half of them remote): 360 -> 0; "small", looked up 30
    # times a sample, 10,800 -> 1; then 360 -> 0 and 360 -> 0.
    reordered = [specs[0], specs[2], specs[1], specs[3]]
    assert [t.ranks for t in plan(reordered, World(2), every).values()] == [(0,), (1,), (1,), (1,)]
    by_traffic = plan(reordered, World(2), every, CostModel(global_batch_size=10))
    assert [t.ranks for t in by_traffic.values()] == [(0,), (1,), (0,), (0,)]
    # Memory: 3,200 + 1,920 do not fit one rank of 4,000 bytes.
    two = {"big": "table_wise", "mid": "table_wise"}
    assert [t.ranks for t in plan(specs[:2], World(1), two).values()] == [(0,), (0,)]
    with pytest.raises(PlanError, match="table 'mid': placement 'table_wise' finds no worker with room"):
        plan(specs[:2], World(1, memory_per_worker=4000), two)
    assert plan(specs[:2], World(2, memory_per_worker=4000), two)["mid"].ranks == (1,)


def test_column_wise_tables_slice_every_row_over_every_rank():
    """Column-wise (issue 43): every rank holds a slice of every row, the first dim % N ranks one column more; a
    table with fewer rows than workers can take it, one with fewer dims than workers cannot."""
    wide = [TableSpec("user", 10, 4), TableSpec("tiny", 2, 4), TableSpec("odd", 7, 5)]
    got = plan(wide, World(3), {s.name: "column_wise" for s in wide}, backend="sok")
    assert list(got.values()) == [_table("user", 10, 4, "column_wise", "sok", reason="chosen by the user"),
                                  _table("tiny", 2, 4, "column_wise", "sok", reason="chosen by the user"),
                                  _table("odd", 7, 5, "column_wise", "sok", reason="chosen by the user")]
    # The widest slice: 10 rows of 2 of 4 columns; 7 rows of 2 of 5 columns (2, 2, 1).
    assert [t.bytes_per_worker for t in got.values()] == [80, 16, 56]
    assert plan(wide[:1], World(2), {"user": "column_wise"}, backend="replicated")["user"].exchange == "hb"
    with pytest.raises(PlanError, match="table 'user': column_wise puts 80 bytes on each of ranks"):
        plan(wide[:1], World(3, memory_per_worker=79), {"user": "column_wise"})
    # One step of batch 10: the 80 bytes of ids reach the 2 other ranks; 2/3 of each 16-byte row comes back and
    # its gradient goes back: 160 + 10 * 2 * 16 * 2 / 3.
    cost = CostModel(global_batch_size=10)
    assert cost.bytes_per_step(wide[0], "column_wise", 3) == pytest.approx(160 + 10 * 2 * 16 * 2 / 3)
    assert cost.bytes_per_step(wide[0], "column_wise", 1) == 0.0
