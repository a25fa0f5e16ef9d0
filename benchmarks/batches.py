"""The batches a benchmark run trains and evaluates on, and which rows each worker gets.

Every worker draws the same global synthetic table (deterministic in the
seed) and keeps its block: global batch ``k`` of a run with ``N`` workers
and per-worker batch ``b`` is rows ``[k*N*b, (k+1)*N*b)``, and worker ``r``
gets rows ``[k*N*b + r*b, k*N*b + (r+1)*b)`` of it. The projection splits
batches the same way, so its bytes can be checked against the counter.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from datasets import schema
from datasets.synthetic import generate_table

Columns = Dict[str, np.ndarray]


def synthetic_rows(rows: int, scale: float, seed: int) -> Columns:
    """``rows`` Criteo-shaped rows: ``label`` [rows], ``dense`` [rows, 13] and ``C1..C26`` [rows] int64."""
    table = generate_table(rows, scale=scale, seed=seed)
    out: Columns = {"label": table.column(schema.LABEL).to_numpy(),
                    "dense": np.stack([table.column(n).to_numpy() for n in schema.DENSE], axis=1)}
    for name in schema.CATEGORICAL:
        out[name] = table.column(name).to_numpy().astype(np.int64)
    return out


def take(columns: Columns, start: int, stop: int) -> Columns:
    """Rows ``[start, stop)`` of every column."""
    return {k: v[start:stop] for k, v in columns.items()}


def worker_batch(columns: Columns, k: int, rank: int, world_size: int, batch_size: int) -> Columns:
    """Worker ``rank``'s share of global batch ``k`` (see the module docstring)."""
    start = (k * world_size + rank) * batch_size
    return take(columns, start, start + batch_size)


def eval_shard(columns: Columns, rank: int, world_size: int, batch_size: int):
    """Worker ``rank``'s evaluation rows ``rank::world_size``, padded to whole batches equal on every worker.

    Returns (padded columns, number of real rows). Every worker gets the same
    number of batches, as sharded lookups need all workers in each step.
    """
    total = len(columns["label"])
    longest = -(-total // world_size)
    padded = -(-longest // batch_size) * batch_size
    index = np.arange(rank, total, world_size)
    real = len(index)
    index = np.concatenate([index, np.zeros(padded - real, dtype=index.dtype)])
    return {k: v[index] for k, v in columns.items()}, real
