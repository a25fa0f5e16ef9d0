"""The sharding plan: where every table lives, as data before the first step.

A :class:`TablePlan` is one table's placement (the planner's answer, see
:mod:`collective.sharding.planner`); a :class:`ShardingPlan` maps the names
users gave their tables to those. ``str(plan)`` is the table rank 0 logs
before the first step; :meth:`ShardingPlan.to_json` is what checkpoints record
and ``COLLECTIVE_SHARDING`` reads back. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Dict, Iterable, Iterator, List, Mapping, Tuple

PLACEMENTS = ("replicated", "row_wise", "table_wise", "column_wise")
KEY_SPACES = ("dense", "hash")
FORMAT = "collective-plan/1"

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4,
                "int64": 8, "uint8": 1, "half": 2, "float": 4, "double": 8}


class PlanError(ValueError):
    """A plan (or an override of one) that cannot hold: it names the table and the reason."""


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a numpy/TensorFlow dtype name); 4 for a name not known."""
    return _DTYPE_BYTES.get(str(dtype), 4)


@dataclasses.dataclass(frozen=True)
class TablePlan:
    """How one table is held.

    Attributes:
      name: the table's name as the user made it (the graph name of its variable).
      shape: the logical ``(rows, dim)``; for a hash table, rows is the capacity over all workers.
      dtype: the values' dtype name (``"float32"``).
      key_space: ``"dense"`` (ids ``0..rows-1``) or ``"hash"`` (any int64 key).
      placement: one of :data:`PLACEMENTS`.
      exchange: the exchange that serves its lookups (a name registered in
        ``collective.embedding.exchanges``), or ``"allreduce"``: an ordinary variable, averaged like a dense layer.
      ranks: the ranks holding its rows.
      packing_group: the physical variable it shares with other tables (``collective_packed/<first table>``, docs/packing.md);
        empty when it is its own variable.
      reason: why, in words.
    """

    name: str
    shape: Tuple[int, int]
    dtype: str
    key_space: str
    placement: str
    exchange: str
    ranks: Tuple[int, ...]
    packing_group: str = ""
    reason: str = ""

    @property
    def rows(self) -> int:
        return int(self.shape[0])

    @property
    def dim(self) -> int:
        return int(self.shape[1])

    @property
    def table_bytes(self) -> int:
        """Bytes of the whole logical table."""
        return self.rows * self.dim * dtype_bytes(self.dtype)

    @property
    def bytes_per_worker(self) -> int:
        """Bytes held by the rank that holds most of the table."""
        holders = max(1, len(self.ranks))
        if self.placement == "row_wise":
            return -(-self.rows // holders) * self.dim * dtype_bytes(self.dtype)
        if self.placement == "column_wise":
            return self.rows * -(-self.dim // holders) * dtype_bytes(self.dtype)
        return self.table_bytes

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "key_space": self.key_space,
                "placement": self.placement, "exchange": self.exchange, "ranks": list(self.ranks),
                "packing_group": self.packing_group, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TablePlan":
        return cls(name=str(d["name"]), shape=(int(d["shape"][0]), int(d["shape"][1])), dtype=str(d["dtype"]),
                   key_space=str(d["key_space"]), placement=str(d["placement"]), exchange=str(d["exchange"]),
                   ranks=tuple(int(r) for r in d["ranks"]), packing_group=str(d.get("packing_group", "")),
                   reason=str(d.get("reason", "")))

    def fingerprint(self) -> str:
        """A digest of what decides where rows live (the reason's words are left out)."""
        d = self.to_dict()
        d.pop("reason")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


class ShardingPlan(Mapping[str, TablePlan]):
    """Every table's :class:`TablePlan` by name, in the order the tables were made, for ``world_size`` workers."""

    def __init__(self, tables: Iterable[TablePlan] = (), world_size: int = 1):
        self._tables: Dict[str, TablePlan] = {}
        for table in tables:
            self._tables[table.name] = table
        self.world_size = int(world_size)

    def __getitem__(self, name: str) -> TablePlan:
        return self._tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def __eq__(self, other) -> bool:
        return (isinstance(other, ShardingPlan) and self.world_size == other.world_size
                and list(self._tables.values()) == list(other._tables.values()))

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        return f"ShardingPlan({len(self)} tables, world_size={self.world_size}, fingerprint={self.fingerprint()})"

    def __str__(self) -> str:
        packed = any(t.packing_group for t in self._tables.values())
        header = ("table", "rows", "dim", "bytes/worker", "placement", "exchange", "ranks") + \
            (("packing group",) if packed else ()) + ("reason",)
        rows = [header] + [(t.name, str(t.rows), str(t.dim), f"{t.bytes_per_worker:,}", t.placement, t.exchange,
                            _ranks(t.ranks)) + ((t.packing_group or "-",) if packed else ()) + (t.reason,)
                           for t in self._tables.values()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        lines = [f"sharding plan: {len(self)} table(s) on {self.world_size} worker(s), fingerprint "
                 f"{self.fingerprint()}"]
        for row in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "world_size": self.world_size,
                           "tables": [t.to_dict() for t in self._tables.values()]}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ShardingPlan":
        try:
            data = json.loads(text)
        except ValueError as err:
            raise PlanError(f"a sharding plan must be the JSON that ShardingPlan.to_json() writes: {err}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PlanError(f"a sharding plan must be the JSON that ShardingPlan.to_json() writes (format "
                            f"{FORMAT!r}); got format {data.get('format') if isinstance(data, dict) else None!r}")
        return cls([TablePlan.from_dict(t) for t in data["tables"]], data["world_size"])

    def fingerprint(self) -> str:
        """A digest of every table's placement (order-free; reasons left out)."""
        parts = sorted(f"{name}={t.fingerprint()}" for name, t in self._tables.items())
        return hashlib.sha256(f"{self.world_size}|{'|'.join(parts)}".encode()).hexdigest()[:16]

    def table_fingerprints(self) -> Dict[str, str]:
        return {name: t.fingerprint() for name, t in self._tables.items()}

    def differing(self, other: "ShardingPlan") -> List[str]:
        """The names of the tables placed differently in ``other`` (or held by only one of the two), sorted."""
        mine, theirs = self.table_fingerprints(), other.table_fingerprints()
        return sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))

    def with_table(self, table: TablePlan) -> "ShardingPlan":
        """This plan with ``table`` added (or replacing the table of its name)."""
        tables = dict(self._tables)
        tables[table.name] = table
        return ShardingPlan(tables.values(), self.world_size)

    def without(self, name: str) -> "ShardingPlan":
        return ShardingPlan([t for n, t in self._tables.items() if n != name], self.world_size)


def _ranks(ranks: Tuple[int, ...]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)
