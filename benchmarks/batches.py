"""Criteo-shaped synthetic rows as numpy columns, for the projection and its tests."""

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
