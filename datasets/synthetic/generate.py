"""Criteo-shaped synthetic data: Zipf-skewed ids, a fixed random teacher, deterministic.

Table sizes are Criteo Kaggle's times ``scale``; ids in each table follow a
power law (rank ``r`` is drawn with probability ~ ``r**-zipf``) and ranks are
scattered over the id space by a fixed bijection, as hashed ids are. Labels
come from a fixed logistic *teacher* (weights on the dense features and a
pseudo-random weight per id, set by ``teacher_seed`` only), so a model that
learns shows it in AUC, and train and test sets drawn with different ``seed``
share one teacher. Everything is vectorised numpy.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Dict, Sequence, Tuple

import numpy as np
import pyarrow as pa

from datasets import schema

_SCATTER = 2654435761  # a prime larger than every table: rank -> id is a bijection
_WEIGHT_CACHE: Dict[int, Dict[Tuple[int, int], np.ndarray]] = {}
DEFAULT_ZIPF = 1.1  # the ids' power-law exponent unless a caller picks another


def cardinalities(scale: float = 0.01) -> Tuple[int, ...]:
    """Criteo Kaggle's table sizes times ``scale``, never below min(original, 16)."""
    if scale <= 0:
        raise ValueError(f"scale={scale} must be > 0 (1.0 gives Criteo Kaggle's table sizes)")
    return tuple(max(min(c, 16), int(round(c * scale))) for c in schema.KAGGLE_CARDINALITIES)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 (wrapping arithmetic): a well-mixed hash of each value."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def zipf_ranks(rng: np.random.Generator, rows: int, n: int, exponent: float) -> np.ndarray:
    """``rows`` ranks in ``[0, n)`` from a continuous power law with ``exponent`` (inverse CDF), as int64."""
    return _zipf_ranks(rng, rows, n, exponent).astype(np.int64, copy=False)


def _zipf_ranks(rng: np.random.Generator, rows: int, n: int, exponent: float) -> np.ndarray:
    """:func:`zipf_ranks` in int32 where ``n`` allows (an index only), computed in place."""
    u = rng.random(rows, dtype=np.float32)
    if abs(exponent - 1.0) < 1e-9:
        u *= np.float32(math.log(n + 1.0))
        np.exp(u, out=u)
    else:
        e = 1.0 - exponent
        u *= np.float32(math.pow(n + 1.0, e) - 1.0)
        u += np.float32(1.0)
        np.power(u, np.float32(1.0 / e), out=u)
    x = u.astype(np.int32 if n < 2**31 - 1 else np.int64)
    x -= 1
    return np.minimum(x, n - 1, out=x)


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The fixed logistic model that labels synthetic rows."""

    dense_weights: np.ndarray
    dense_center: np.ndarray
    table_scales: np.ndarray
    salt: int
    bias: float = 0.0

    @classmethod
    def create(cls, teacher_seed: int = 0, ctr: float = 0.25, strength: float = 1.0, scale: float = 0.01,
               zipf: float = 1.1) -> "Teacher":
        """A teacher from ``teacher_seed`` whose mean click rate is about ``ctr`` on data of ``scale`` and ``zipf``."""
        rng = np.random.default_rng([teacher_seed, 7919])
        n_dense, n_cat = len(schema.DENSE), len(schema.CATEGORICAL)
        teacher = cls(dense_weights=rng.normal(0, 1.0, n_dense) * strength / math.sqrt(n_dense),
                      dense_center=np.full(n_dense, 1.5),
                      table_scales=np.abs(rng.normal(0, 1.0, n_cat)) * strength * 1.5 / math.sqrt(n_cat),
                      salt=int(rng.integers(1 << 62)))
        probe_dense, probe_ids = _features(np.random.default_rng([teacher_seed, 104729]), 20000,
                                           cardinalities(scale), zipf)
        logits = teacher.logits(probe_dense, probe_ids).astype(np.float64)
        lo, hi = -20.0, 20.0
        for _ in range(60):  # bisection on the bias for the target click rate
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(logits + mid)))) < ctr else (lo, mid)
        return dataclasses.replace(teacher, bias=(lo + hi) / 2)

    def id_weights(self, table: int, ids: np.ndarray) -> np.ndarray:
        """The pseudo-random weight of each id of ``table`` (a hash of table and id, scaled)."""
        key = ids.astype(np.uint64) ^ np.uint64((self.salt + 0x632BE59BD9B4E019 * (table + 1)) & 0xFFFFFFFFFFFFFFFF)
        unit = (_splitmix(key) >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
        return (unit * 2 - 1) * np.float32(math.sqrt(3.0) * self.table_scales[table])

    def weight_table(self, table: int, size: int) -> np.ndarray:
        """:meth:`id_weights` of ids ``0..size-1``, cached: a row's weight is then one gather."""
        key = (table, size)
        if key not in _WEIGHT_CACHE.setdefault(id(self), {}):
            _WEIGHT_CACHE[id(self)][key] = self.id_weights(table, np.arange(size, dtype=np.int64))
        return _WEIGHT_CACHE[id(self)][key]

    def logits(self, dense: np.ndarray, ids: Sequence[np.ndarray], sizes: Sequence[int] = None) -> np.ndarray:
        """Logits of rows with ``dense`` ``[rows, 13]`` (transformed) and 26 id arrays.

        With ``sizes`` (the table sizes) the per-id weights come from cached tables.
        """
        out = (dense - self.dense_center.astype(dense.dtype)) @ self.dense_weights.astype(dense.dtype)
        out = out.astype(np.float32) + np.float32(self.bias)
        for t, column in enumerate(ids):
            out += self.weight_table(t, sizes[t])[column] if sizes is not None else self.id_weights(t, column)
        return out


def _features(rng: np.random.Generator, rows: int, cards: Sequence[int],
              zipf: float) -> Tuple[np.ndarray, list]:
    """Dense features (log(x+1) of skewed integer counts, 0 where missing) and Zipf ids per table."""
    z = rng.standard_normal((rows, len(schema.DENSE)), dtype=np.float32) * np.float32(1.5) + np.float32(1.0)
    # log(count + 1) for count = floor(exp(z)) - 1, clipped at 0: log(floor(exp(z))) where exp(z) >= 1.
    dense = np.log(np.maximum(np.floor(np.exp(z)), np.float32(1.0)))
    dense[rng.random(dense.shape, dtype=np.float32) < 0.1] = 0.0
    ids = []
    for t, n in enumerate(cards):
        ids.append(_scatter_table(t, n)[_zipf_ranks(rng, rows, n, zipf)])
    return dense, ids


def rank_ids(table: int, n: int, ranks: np.ndarray) -> np.ndarray:
    """The ids of popularity ``ranks`` (0 the most frequent) in ``table`` of ``n`` rows: a fixed bijection."""
    return (np.asarray(ranks, dtype=np.int64) * _SCATTER + 977 * table) % n


@functools.lru_cache(maxsize=64)
def _scatter_table(table: int, n: int) -> np.ndarray:
    """:func:`rank_ids` of every rank of ``table``, tabulated (a gather beats int64 %)."""
    return rank_ids(table, n, np.arange(n, dtype=np.int64))


def generate_table(rows: int, *, scale: float = 0.01, seed: int = 0, zipf: float = DEFAULT_ZIPF,
                   teacher: Teacher = None, stream: int = 0) -> pa.Table:
    """``rows`` synthetic rows in the Criteo schema (:func:`datasets.schema.arrow_schema`).

    The same ``(rows, scale, seed, zipf, teacher, stream)`` always gives the
    same table; ``stream`` tells apart chunks drawn with one seed.
    """
    if rows < 0:
        raise ValueError(f"rows={rows} must be >= 0")
    teacher = teacher or default_teacher(scale, zipf)
    rng = np.random.default_rng([seed, stream, 1])
    sizes = cardinalities(scale)
    dense, ids = _features(rng, rows, sizes, zipf)
    p = 1 / (1 + np.exp(-teacher.logits(dense, ids, sizes)))
    labels = (rng.random(rows, dtype=np.float32) < p).astype(np.float32)
    columns: Dict[str, np.ndarray] = {schema.LABEL: labels}
    dense_columns = np.ascontiguousarray(dense.T)
    for j, name in enumerate(schema.DENSE):
        columns[name] = dense_columns[j]
    for name, column in zip(schema.CATEGORICAL, ids):
        columns[name] = column
    return pa.Table.from_pydict(columns, schema=schema.arrow_schema())


@functools.lru_cache(maxsize=8)
def default_teacher(scale: float = 0.01, zipf: float = 1.1) -> Teacher:
    """The teacher of ``teacher_seed`` 0 for data of ``scale`` and ``zipf``, built once."""
    return Teacher.create(0, scale=scale, zipf=zipf)
