"""The planner: every placement rule, in one pure function (:func:`plan`). No TensorFlow here.

Defaults (what each API did before the plan existed):

- hash tables (``key_space="hash"``) and SOK's tables (``api="sok"``) are
  ``row_wise``: row (key) ``i`` on rank ``i % N``;
- a table of ``embedding_scope()`` with fewer rows than workers is an
  ordinary variable (``replicated``, exchange ``allreduce``: its gradient is
  averaged like a dense layer's);
- under the ``replicated`` backend, or below ``replicate_below_bytes``, it is
  ``replicated``: whole on every rank, served by the ``replicated`` exchange;
- otherwise ``row_wise``.

A ``row_wise``, ``table_wise`` or ``column_wise`` table is served by the strategy's backend,
or by ``hb`` when that backend is ``replicated`` (which serves whole tables
only). ``table_wise`` comes from overrides only: each such table goes to the
least loaded rank with room (:meth:`CostModel.load`), in the order tables are made.

Overrides (a mapping of table name to placement, a callable from the default
:class:`~collective.sharding.plan.TablePlan` to a placement or None, or a
whole :class:`~collective.sharding.plan.ShardingPlan`) replace the default;
one that cannot hold raises :class:`~collective.sharding.plan.PlanError`
naming the table and why.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from collective.byte_model import sent_bytes
from collective.sharding.plan import KEY_SPACES, PLACEMENTS, PlanError, ShardingPlan, TablePlan, dtype_bytes

APIS = ("scope", "sok")
# The exchange that serves sharded tables when the step's backend serves whole tables only.
SHARDED_FALLBACK = "hb"
# Placements each kind of table can have today (column_wise of hash tables and SOK's own tables but row_wise are
# not built yet).
BUILT = {("dense", "scope"): ("replicated", "row_wise", "table_wise", "column_wise"), ("dense", "sok"): ("row_wise",),
         ("hash", "scope"): ("row_wise", "table_wise"), ("hash", "sok"): ("row_wise",)}
ID_BYTES = 8
USER = "chosen by the user"
# The exchange of a table planned as an ordinary variable (fewer rows than workers): none, its gradient is averaged.
ORDINARY = "allreduce"

Overrides = Union[None, Mapping[str, str], Callable[[TablePlan], Optional[str]], ShardingPlan]


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """What the planner knows of a table when it is made.

    Attributes:
      name: the name the user gave (the variable's graph name).
      rows: logical rows (a hash table's capacity over all workers).
      dim: the width of a row.
      dtype: the values' dtype name.
      key_space: ``"dense"`` or ``"hash"``.
      api: ``"scope"`` (``embedding_scope()``'s getters, hash tables) or ``"sok"`` (SOK's layers and
        ``sok.Variable``, row-wise by SOK's contract).
      ids_per_sample: ids one sample looks up in it (default: the cost model's).
    """

    name: str
    rows: int
    dim: int
    dtype: str = "float32"
    key_space: str = "dense"
    api: str = "scope"
    ids_per_sample: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class World:
    """The workers: how many, how many per host, and each one's memory for tables (bytes; None: not bounded)."""

    size: int
    workers_per_host: int = 1
    memory_per_worker: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class CostModel:
    """What a placement costs.

    Attributes:
      global_batch_size: samples per step over all workers (0: unknown; table-wise tables are then spread by
        their bytes).
      ids_per_sample: ids one sample looks up in a table, where its spec does not say.
      replicate_below_bytes: tables smaller than this are replicated (``COLLECTIVE_REPLICATE_BELOW_BYTES``).
    """

    global_batch_size: int = 0
    ids_per_sample: float = 1.0
    replicate_below_bytes: int = 0

    def bytes_per_step(self, spec: TableSpec, placement: str, n: int) -> float:
        """Bytes one step sends for ``spec`` over all workers.

        ``row_wise`` and ``table_wise``: each id not held locally goes to its owner and its vector comes back,
        and its gradient goes back again (``(N - 1) / N`` of the lookups). ``replicated``: every worker's ids
        and gradient rows are allgathered (each reaches ``N - 1`` others). ``column_wise``: every id is
        allgathered, and the ``(N - 1) / N`` of each row held elsewhere comes back and its gradient goes back.
        """
        lookups = self.global_batch_size * (spec.ids_per_sample or self.ids_per_sample)
        row = spec.dim * dtype_bytes(spec.dtype)
        if n <= 1:
            return 0.0
        if placement == "replicated":
            return sent_bytes("allgather", lookups * (ID_BYTES + row), n)  # linear: all workers' inputs at once
        if placement == "column_wise":
            return sent_bytes("allgather", lookups * ID_BYTES, n) + lookups * 2 * row * (n - 1) / n
        return lookups * (ID_BYTES + 2 * row) * (n - 1) / n

    def load(self, spec: TableSpec, n: int) -> float:
        """What a table-wise table adds to its rank: bytes per step when the batch is known, else its bytes."""
        if self.global_batch_size:
            return self.bytes_per_step(spec, "table_wise", n)
        return float(spec.rows * spec.dim * dtype_bytes(spec.dtype))


def plan(specs: Sequence[TableSpec], world: World, overrides: Overrides = None, cost: CostModel = CostModel(),
         backend: str = "hb", partial: bool = False) -> ShardingPlan:
    """The plan of ``specs`` (in the order the tables are made) on ``world``.

    ``partial=True`` plans the tables made so far: overrides naming tables not among them are not refused yet.
    The answer for a table depends only on the specs before it, so planning a prefix gives the same tables.
    Raises :class:`PlanError` for an override that cannot hold.
    """
    n = world.size
    chosen = _fixed(overrides)
    if not partial and isinstance(overrides, Mapping) and not isinstance(overrides, ShardingPlan):
        unknown = sorted(set(overrides) - {s.name for s in specs})
        if unknown:
            raise PlanError(f"sharding override names table(s) {', '.join(map(repr, unknown))} that the model does "
                            f"not make; its tables are {', '.join(repr(s.name) for s in specs) or 'none'}")
    load = [0.0] * n
    held = [0] * n
    tables: List[TablePlan] = []
    for spec in specs:
        _check_spec(spec)
        default = _default(spec, n, cost, backend)
        wanted = _wanted(spec, default, overrides, chosen)
        table = default if wanted is None or wanted == default.placement else \
            _overridden(spec, wanted, world, backend, load, held, overrides)
        for r in table.ranks:
            held[r] += table.bytes_per_worker
        if table.placement == "table_wise":
            load[table.ranks[0]] += cost.load(spec, n)
        if world.memory_per_worker is not None and table.reason == USER \
                and any(held[r] > world.memory_per_worker for r in table.ranks):
            raise PlanError(f"table {spec.name!r}: {table.placement} puts {table.bytes_per_worker:,} bytes on each "
                            f"of ranks {list(table.ranks)}, more than the {world.memory_per_worker:,} bytes a worker "
                            f"has for tables with the tables before it")
        tables.append(table)
    return ShardingPlan(tables, n)


def _check_spec(spec: TableSpec) -> None:
    if spec.key_space not in KEY_SPACES or spec.api not in APIS:
        raise PlanError(f"table {spec.name!r}: key_space {spec.key_space!r} / api {spec.api!r} must be one of "
                        f"{KEY_SPACES} / {APIS}")


def _fixed(overrides: Overrides) -> Dict[str, str]:
    if isinstance(overrides, ShardingPlan):
        return {name: t.placement for name, t in overrides.items()}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    return {}


def _wanted(spec: TableSpec, default: TablePlan, overrides: Overrides, chosen: Dict[str, str]) -> Optional[str]:
    wanted = overrides(default) if callable(overrides) and not isinstance(overrides, Mapping) else \
        chosen.get(spec.name)
    if wanted is not None:
        check_placement(spec.name, wanted)
    return wanted


def check_placement(table: str, placement: str) -> None:
    """Raises :class:`PlanError` naming ``table`` when ``placement`` is not one of :data:`PLACEMENTS`."""
    if placement not in PLACEMENTS:
        raise PlanError(f"table {table!r}: unknown placement {placement!r}; the placements are "
                        f"{', '.join(PLACEMENTS)}")


def hierarchical_pays(host_sizes: Sequence[int]) -> bool:
    """Whether the hierarchical exchange (:mod:`collective.embedding.exchanges.hierarchical`) pays on hosts of
    ``host_sizes`` workers: on more than one host with a host of several workers. It merges each host's ids
    before they cross hosts, so it never sends more across hosts than the flat all-to-all, and less wherever
    two workers of a host ask for one id; with one worker per host it would send the same bytes one hop later.
    """
    return len(host_sizes) > 1 and max(host_sizes) > 1


def packable(placement: str, backend: str) -> bool:
    """Whether a fixed-vocabulary table of ``placement`` may share a packing group's variable under ``backend``
    (docs/packing.md, stage 2): row-wise tables served by ``hb``."""
    return placement == "row_wise" and backend == "hb"


def exchange_for(placement: str, backend: str) -> str:
    """The exchange serving a ``placement`` table's lookups in a step of ``backend`` (the rule lookups follow)."""
    if placement == "replicated":
        return "replicated"
    return SHARDED_FALLBACK if backend == "replicated" else backend


def _default(spec: TableSpec, n: int, cost: CostModel, backend: str) -> TablePlan:
    everyone = tuple(range(n))
    nbytes = spec.rows * spec.dim * dtype_bytes(spec.dtype)

    def made(placement: str, reason: str, exchange: Optional[str] = None) -> TablePlan:
        return TablePlan(spec.name, (int(spec.rows), int(spec.dim)), spec.dtype, spec.key_space, placement,
                         exchange or exchange_for(placement, backend), everyone, "", reason)

    if spec.key_space == "hash":
        return made("row_wise", "hash table: key k on rank k % N")
    if spec.api == "sok":
        return made("row_wise", "SOK's layout: row i on rank i % N")
    if spec.rows < n:
        return made("replicated", f"fewer rows ({spec.rows}) than workers ({n}): an ordinary variable, "
                                  "averaged like a dense layer", exchange=ORDINARY)
    if backend == "replicated":
        return made("replicated", "the replicated backend")
    if nbytes < cost.replicate_below_bytes:
        return made("replicated", f"{nbytes:,} bytes, below replicate_below_bytes={cost.replicate_below_bytes:,}")
    return made("row_wise", "default: row i on rank i % N")


def _overridden(spec: TableSpec, wanted: str, world: World, backend: str, load: List[float], held: List[int],
                overrides: Overrides) -> TablePlan:
    n = world.size
    nbytes = spec.rows * spec.dim * dtype_bytes(spec.dtype)
    where = f"table {spec.name!r}: placement {wanted!r} "
    if spec.key_space == "hash" and wanted in ("column_wise", "replicated"):
        raise PlanError(where + "cannot hold a hash table: each worker holds the keys it owns; hash tables are "
                                "row_wise or table_wise")
    if wanted in ("table_wise", "replicated") and world.memory_per_worker is not None \
            and nbytes > world.memory_per_worker:
        raise PlanError(where + f"puts the whole table ({nbytes:,} bytes) on one worker, more than the "
                                f"{world.memory_per_worker:,} bytes a worker has for tables; use row_wise")
    if wanted not in BUILT[(spec.key_space, spec.api)]:
        kind = "a SOK table" if spec.api == "sok" else "a hash table" if spec.key_space == "hash" else "a table"
        raise PlanError(where + f"is not built for {kind} yet; {kind} can be "
                                f"{' or '.join(BUILT[(spec.key_space, spec.api)])}")
    if wanted == "row_wise" and spec.rows < n:
        raise PlanError(where + f"needs at least one row per worker: {spec.rows} rows on {n} workers; use "
                                "replicated")
    if wanted == "column_wise" and spec.dim < n:
        raise PlanError(where + f"needs at least one column per worker: dim {spec.dim} on {n} workers; use "
                                "row_wise or replicated")
    ranks = tuple(range(n))
    if wanted == "table_wise":
        ranks = (_table_rank(spec, world, load, held, overrides),)
    return TablePlan(spec.name, (int(spec.rows), int(spec.dim)), spec.dtype, spec.key_space, wanted,
                     exchange_for(wanted, backend), ranks, "", USER)


def _table_rank(spec: TableSpec, world: World, load: List[float], held: List[int], overrides: Overrides) -> int:
    """The rank of a table-wise table: the one a plan of this world gave it, else the least loaded with room."""
    if isinstance(overrides, ShardingPlan) and overrides.world_size == world.size and spec.name in overrides:
        given = overrides[spec.name].ranks
        if len(given) == 1 and 0 <= given[0] < world.size:
            return given[0]
    nbytes = spec.rows * spec.dim * dtype_bytes(spec.dtype)
    room = [r for r in range(world.size)
            if world.memory_per_worker is None or held[r] + nbytes <= world.memory_per_worker]
    if not room:
        raise PlanError(f"table {spec.name!r}: placement 'table_wise' finds no worker with room for "
                        f"{nbytes:,} bytes beside the tables before it (memory per worker "
                        f"{world.memory_per_worker:,} bytes)")
    return min(room, key=lambda r: (load[r], r))
