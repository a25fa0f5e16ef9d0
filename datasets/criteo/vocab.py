"""Categorical values -> integer ids: frequency-thresholded vocabularies or hashing.

Id 0 always means *missing or out of vocabulary*; known values get ids from
1 on, most frequent first (ties by value), so hot ids are small.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather

from datasets import schema


class VocabularyError(ValueError):
    """A vocabulary file that cannot be used; the message names it."""


class FrequencyCounter:
    """Counts values per table in constant memory per distinct value (merged every few blocks)."""

    def __init__(self, tables: Sequence[str] = schema.CATEGORICAL):
        self.tables = list(tables)
        self._parts: Dict[str, List[Tuple[np.ndarray, np.ndarray]]] = {t: [] for t in self.tables}

    def update(self, table: str, values: np.ndarray) -> None:
        """Counts ``values`` (uint64) of ``table``."""
        keys, counts = np.unique(values, return_counts=True)
        parts = self._parts[table]
        parts.append((keys, counts.astype(np.int64)))
        if len(parts) >= 16:
            self._parts[table] = [self._merge(parts)]

    @staticmethod
    def _merge(parts: List[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate([k for k, _ in parts])
        counts = np.concatenate([c for _, c in parts])
        unique, inverse = np.unique(keys, return_inverse=True)
        return unique, np.bincount(inverse, weights=counts, minlength=len(unique)).astype(np.int64)

    def vocabulary(self, min_count: int = 1) -> "Vocabulary":
        """The values seen at least ``min_count`` times, as a :class:`Vocabulary`."""
        tables = {}
        for name in self.tables:
            parts = self._parts[name]
            keys, counts = self._merge(parts) if parts else (np.zeros(0, np.uint64), np.zeros(0, np.int64))
            keep = counts >= min_count
            tables[name] = Vocabulary.table_from_counts(keys[keep], counts[keep])
        return Vocabulary(tables)


@dataclasses.dataclass
class Vocabulary:
    """Per table: sorted keys, their ids and counts."""

    tables: Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]]

    @staticmethod
    def table_from_counts(keys: np.ndarray, counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = np.lexsort((keys, -counts))  # most frequent first, ties by value
        ids = np.empty(len(keys), dtype=np.int64)
        ids[order] = np.arange(1, len(keys) + 1)
        return keys.astype(np.uint64), ids, counts.astype(np.int64)

    def size(self, table: str) -> int:
        """Rows the embedding table needs: known values plus id 0."""
        return len(self.tables[table][0]) + 1

    def lookup(self, table: str, values: np.ndarray, present: np.ndarray) -> np.ndarray:
        """Ids of ``values``; 0 where not ``present`` or not in the vocabulary."""
        keys, ids, _ = self.tables[table]
        if not len(keys):
            return np.zeros(len(values), dtype=np.int64)
        index = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
        found = present & (keys[index] == values)
        return np.where(found, ids[index], 0)

    def save(self, path: str) -> None:
        """Writes columns ``table``, ``value`` (the hex value as uint64), ``id`` and ``count`` to ``path``.

        The file is Arrow IPC (Feather), not Parquet, so that a directory of
        converted data can be read as a whole without picking it up.
        """
        columns = {"table": [], "value": [], "id": [], "count": []}
        for name, (keys, ids, counts) in self.tables.items():
            columns["table"].append(np.full(len(keys), name, dtype=object))
            columns["value"].append(keys.astype(np.uint64))
            columns["id"].append(ids)
            columns["count"].append(counts)
        feather.write_feather(pa.table({k: np.concatenate(v) for k, v in columns.items()}), path)

    @classmethod
    def load(cls, path: str, tables: Sequence[str] = schema.CATEGORICAL) -> "Vocabulary":
        """Reads a vocabulary written by :meth:`save`."""
        try:
            table = feather.read_table(path)
        except (OSError, pa.ArrowInvalid) as exc:
            raise VocabularyError(f"cannot read vocabulary {path!r}: {exc}; give a file written by the converter") \
                from exc
        missing = {"table", "value", "id", "count"} - set(table.column_names)
        if missing:
            raise VocabularyError(f"vocabulary {path!r} lacks column(s) {', '.join(sorted(missing))}")
        names = table.column("table").to_numpy()
        values = table.column("value").to_numpy().astype(np.uint64)
        ids, counts = table.column("id").to_numpy(), table.column("count").to_numpy()
        out = {}
        for name in tables:
            sel = names == name
            order = np.argsort(values[sel])
            out[name] = (values[sel][order], ids[sel][order], counts[sel][order])
        return cls(out)


def hashed_ids(values: np.ndarray, present: np.ndarray, buckets: int) -> np.ndarray:
    """Ids in ``[1, buckets)`` from the value modulo ``buckets - 1``; 0 where missing."""
    if buckets < 2:
        raise ValueError(f"hash_buckets={buckets} must be at least 2 (id 0 is kept for missing values)")
    return np.where(present, (values % np.uint64(buckets - 1)).astype(np.int64) + 1, 0)


def table_sizes(vocabulary: Optional[Vocabulary], buckets: Optional[int]) -> List[int]:
    """Embedding rows each categorical column needs."""
    if vocabulary is not None:
        return [vocabulary.size(name) for name in schema.CATEGORICAL]
    return [int(buckets)] * len(schema.CATEGORICAL)
