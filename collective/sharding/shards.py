"""Each worker's :class:`~collective.embedding.table.ShardInfo`, made from the plan: the only place one is made.

A face (``embedding_scope()``'s getters, hash tables, SOK's layers and
variables) describes its table as a :class:`~collective.sharding.planner.TableSpec`;
:func:`place` asks the current planning (:mod:`collective.sharding.runtime`)
and returns this worker's shard of the answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from collective.embedding.table import ShardInfo
from collective.sharding import runtime
from collective.sharding.plan import TablePlan
from collective.sharding.planner import TableSpec


def shard_info(table: TablePlan, rank: int, world_size: int, name: Optional[str] = None,
               hash_index: Any = None) -> ShardInfo:
    """Rank ``rank``'s shard of the planned ``table``."""
    holder = table.ranks[0] if table.placement == "table_wise" else None
    return ShardInfo(name=name or table.name, vocab=table.rows, dim=table.dim, rank=rank, world_size=world_size,
                     hash_index=hash_index, replicated=table.placement == "replicated", holder=holder,
                     column_wise=table.placement == "column_wise")


def place(spec: TableSpec, replicate_below_bytes: Optional[int] = None, hash_index: Any = None) -> ShardInfo:
    """This worker's shard of ``spec``, as the current planning places it."""
    planning = runtime.current()
    table = planning.place(spec, replicate_below_bytes)
    return shard_info(table, planning.rank, planning.world_size, hash_index=hash_index)


def plan_of(spec: TableSpec, replicate_below_bytes: Optional[int] = None) -> TablePlan:
    """The current planning's plan of ``spec`` (for a face that needs to know before it makes the variable)."""
    return runtime.current().place(spec, replicate_below_bytes)


def record_name(planned: str, made: str) -> None:
    """Records that the table planned as ``planned`` was made as the variable ``made``."""
    runtime.current().rename(planned, made)


def pack(names, group: str) -> None:
    """Records that the tables ``names`` share the packing group ``group``."""
    runtime.current().pack(set(names), group)


def renamed(info: ShardInfo, name: str, hash_index: Any = None) -> ShardInfo:
    """``info`` under the graph name its variable got (the plan follows), with ``hash_index`` when given."""
    record_name(info.name, name)
    changes = {"name": name}
    if hash_index is not None:
        changes["hash_index"] = hash_index
    return dataclasses.replace(info, **changes)


def hash_capacity(info: ShardInfo, capacity_per_worker: int) -> int:
    """Keys this worker's index of a hash table has room for: ``capacity_per_worker`` when row-wise; table-wise,
    every worker's capacity (the planned rows) on the holder and none elsewhere."""
    if info.holder is None:
        return int(capacity_per_worker)
    return info.layout.rows_held(info.vocab)


def export_shard(name: str, rows: int, dim: int, hash_index: Any) -> ShardInfo:
    """The one-worker shard of a hash table's export form (an export is one process: no plan)."""
    return ShardInfo(name=name, vocab=rows, dim=dim, rank=0, world_size=1, hash_index=hash_index)
