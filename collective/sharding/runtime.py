"""The plan of this run: built as tables are made, logged by rank 0 and agreed on by all ranks before step 0.

A :class:`Planning` belongs to a ``CollectiveStrategy`` (its ``sharding=``
overrides, its backend, its ``replicate_below_bytes``); its scopes make it
:func:`current`, so every face (``embedding_scope()``'s getters, hash tables,
SOK's layers and variables) places its tables through it. Outside any
strategy, a planning of the process's context (``COLLECTIVE_*`` variables)
serves. ``COLLECTIVE_SHARDING=plan.json`` (a plan ``to_json`` wrote) gives the
overrides when the strategy is given none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
from typing import Callable, Dict, Iterator, List, Mapping, Optional

from collective import context
from collective.sharding import planner
from collective.sharding.plan import PlanError, ShardingPlan, TablePlan

ENV = "COLLECTIVE_SHARDING"
logger = logging.getLogger("collective.sharding")

_local = threading.local()
_lock = threading.Lock()
_default: Dict[str, object] = {}
_latest: List[Optional["Planning"]] = [None]
_logged: List[Optional[str]] = [None]


class PlanMismatchError(PlanError):
    """Ranks hold different plans: they would route ids to rows nobody holds."""


def overrides_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[ShardingPlan]:
    """The plan ``COLLECTIVE_SHARDING`` names (a file ``ShardingPlan.to_json`` wrote), else None."""
    env = os.environ if env is None else env
    path = env.get(ENV, "").strip()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise PlanError(f"{ENV}={path!r}: cannot read it ({err}); give a file that ShardingPlan.to_json() wrote, "
                        "or unset it") from None
    return ShardingPlan.from_json(text)


def check_overrides(overrides: planner.Overrides) -> planner.Overrides:
    """``overrides`` as given (a mapping of names to placements, a callable or a plan), or a TypeError/PlanError."""
    if overrides is None or callable(overrides) and not isinstance(overrides, Mapping):
        return overrides
    if isinstance(overrides, ShardingPlan):
        return overrides
    if not isinstance(overrides, Mapping):
        raise TypeError(f"sharding={overrides!r}: give a dict of table name -> placement, a callable from a "
                        "TablePlan to a placement (or None), or a ShardingPlan")
    for name, placement in overrides.items():
        planner.check_placement(name, placement)
    return dict(overrides)


class Planning:
    """The plan of the tables one strategy (or the process's context) makes, extended as each is made."""

    def __init__(self, ctx: context.Context, overrides: planner.Overrides = None,
                 memory_per_worker: Optional[int] = None, global_batch_size: int = 0, ids_per_sample: float = 1.0):
        if overrides is None:
            overrides = overrides_from_env()
        self.overrides = check_overrides(overrides)
        self.rank, self.world_size, self.backend = ctx.rank, ctx.world_size, ctx.backend
        self.world = planner.World(ctx.world_size, ctx.local_size, memory_per_worker)
        self.cost = planner.CostModel(global_batch_size, ids_per_sample, ctx.replicate_below_bytes)
        self._specs: List[planner.TableSpec] = []
        self._packing: Dict[str, str] = {}
        self.plan = ShardingPlan((), ctx.world_size)

    def place(self, spec: planner.TableSpec, replicate_below_bytes: Optional[int] = None) -> TablePlan:
        """The plan of table ``spec``. Made again under the same name (in a new graph), it replaces the earlier one
        in its place, so the tables after it keep their placements."""
        known = any(s.name == spec.name for s in self._specs)
        specs = [spec if s.name == spec.name else s for s in self._specs] if known else self._specs + [spec]
        cost = self.cost if replicate_below_bytes is None else \
            planner.CostModel(self.cost.global_batch_size, self.cost.ids_per_sample, replicate_below_bytes)
        with _lock:
            plan = self._packed(planner.plan(specs, self.world, self.overrides, cost, self.backend, partial=True))
            self._specs, self.plan = specs, plan
            _latest[0] = self
        return plan[spec.name]

    def rename(self, old: str, new: str) -> None:
        """Records that table ``old`` got the graph name ``new`` when it was made."""
        if old == new or old not in self.plan:
            return
        with _lock:
            table = self.plan[old]
            self._specs = [s if s.name != old else _renamed(s, new) for s in self._specs if s.name != new]
            tables = [t if t.name != old else _renamed(table, new) for t in self.plan.values() if t.name != new]
            self.plan = ShardingPlan(tables, self.world_size)

    def pack(self, names, group: str) -> None:
        """Records that tables ``names`` share the packing group ``group`` (one physical variable per worker)."""
        with _lock:
            self._packing.update((name, group) for name in names)
            self.plan = self._packed(self.plan)

    def _packed(self, plan: ShardingPlan) -> ShardingPlan:
        """``plan`` with the packing groups recorded by :meth:`pack`."""
        if not any(name in self._packing for name in plan):
            return plan
        return ShardingPlan([dataclasses.replace(t, packing_group=self._packing.get(t.name, t.packing_group))
                             for t in plan.values()], plan.world_size)

    def complete(self) -> ShardingPlan:
        """The plan of every table made, checked whole: an override naming a table never made is refused."""
        planner.plan(self._specs, self.world, self.overrides, self.cost, self.backend, partial=False)
        return self.plan


def _renamed(item, name: str):
    return dataclasses.replace(item, name=name)


@contextlib.contextmanager
def using(planning: Planning) -> Iterator[Planning]:
    """Tables made in the block are placed by ``planning``."""
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(planning)
    try:
        yield planning
    finally:
        stack.pop()


def enclosing() -> Optional[Planning]:
    """The innermost :func:`using` block's planning, if the caller is inside one."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def current() -> Planning:
    """The innermost :func:`using` block's planning, else the process context's (made on first use)."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    ctx = context.get()
    with _lock:
        if _default.get("context") is not ctx:
            _default.update(context=ctx, planning=None)
    if _default["planning"] is None:
        _default["planning"] = Planning(ctx)
    return _default["planning"]  # type: ignore[return-value]


def latest() -> Optional[Planning]:
    """The planning that placed the last table made in this process, if any."""
    return _latest[0]


def active() -> Optional[Planning]:
    """The innermost :func:`using` block's planning (a strategy's scope), else :func:`latest`."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else latest()


def announce(planning: Optional[Planning] = None, broadcast: Optional[Callable[[str], str]] = None) -> ShardingPlan:
    """Before step 0: checks the plan whole, agrees on it with every rank, and rank 0 logs it (once per plan).

    ``broadcast(text)`` gives rank 0's ``text`` on every rank (default
    :func:`collective.comm.broadcast_string`); a rank whose plan differs
    raises :class:`PlanMismatchError` naming the tables that differ.
    """
    planning = planning or active() or current()
    plan = planning.complete()
    if planning.world_size > 1:
        if broadcast is None:
            from collective import comm  # pylint: disable=import-outside-toplevel

            def broadcast(text: str) -> str:
                return comm.broadcast_string(text, max_bytes=1 << 20)
        agree(plan, broadcast(json.dumps(plan.table_fingerprints(), sort_keys=True)), planning.rank)
    if planning.rank == 0 and _logged[0] != plan.fingerprint() and len(plan):
        _logged[0] = plan.fingerprint()
        logger.info("%s", plan)
    return plan


def agree(plan: ShardingPlan, rank0_fingerprints: str, rank: int) -> None:
    """Raises :class:`PlanMismatchError` when ``plan`` differs from rank 0's (its per-table fingerprints as JSON)."""
    theirs: Dict[str, str] = json.loads(rank0_fingerprints or "{}")
    mine = plan.table_fingerprints()
    differ = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
    if differ:
        raise PlanMismatchError(f"rank {rank} holds another sharding plan than rank 0 for table(s) "
                                f"{', '.join(map(repr, differ))}: every rank must make the same tables with the same "
                                f"shapes and the same sharding overrides (fingerprint {plan.fingerprint()} here)")
