"""The Criteo table layout shared by the Criteo converter and the synthetic generator.

One row: ``label`` (float32, 0 or 1), ``I1..I13`` (float32, after the
numeric transform, 0 where missing) and ``C1..C26`` (int64 ids; 0 means
missing or infrequent).
"""

from __future__ import annotations

from typing import Tuple

import pyarrow as pa

LABEL = "label"
DENSE: Tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL: Tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
COLUMNS: Tuple[str, ...] = (LABEL,) + DENSE + CATEGORICAL

LABEL_TYPE = pa.float32()
DENSE_TYPE = pa.float32()
CATEGORICAL_TYPE = pa.int64()

# Distinct values per categorical column in Criteo Kaggle (the table sizes DLRM uses).
KAGGLE_CARDINALITIES: Tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)


def arrow_schema() -> pa.Schema:
    """The Parquet schema of a Criteo-shaped table."""
    return pa.schema([pa.field(LABEL, LABEL_TYPE, nullable=False)]
                     + [pa.field(name, DENSE_TYPE, nullable=False) for name in DENSE]
                     + [pa.field(name, CATEGORICAL_TYPE, nullable=False) for name in CATEGORICAL])
