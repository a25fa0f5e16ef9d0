"""The Criteo table layout shared by the Criteo converter and the synthetic generator.

One row: ``label`` (float32, 0 or 1), ``I1..I13`` (float32, after the
numeric transform, 0 where missing) and ``C1..C26`` (int64 ids; 0 means
missing or infrequent).

A data set is a directory with ``train/`` and ``test/`` folders of Parquet
files and ``meta.json``, whose ``cardinalities`` (the table size of C1..C26,
ids in ``[0, size)``) size the model's tables. The Criteo converter, the
synthetic generator and the model zoo share it through :func:`write_meta`
and :func:`read_meta`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Sequence, Tuple

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


META_FILE = "meta.json"


class MetaError(ValueError):
    """A data set's ``meta.json`` is missing or does not say what the model needs."""


def write_meta(directory: str, cardinalities: Sequence[int], **info: Any) -> str:
    """Writes ``directory/meta.json``: ``cardinalities`` (C1..C26 table sizes) and any other ``info``."""
    sizes = [int(size) for size in cardinalities]
    if len(sizes) != len(CATEGORICAL) or min(sizes) < 1:
        raise MetaError(f"cardinalities must be {len(CATEGORICAL)} table sizes >= 1, got {sizes}")
    path = os.path.join(directory, META_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump({"schema": list(COLUMNS), "cardinalities": sizes, **info}, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def read_meta(directory: str) -> Dict[str, Any]:
    """``directory/meta.json`` as a dict whose ``cardinalities`` is checked: 26 table sizes >= 1.

    Raises :class:`MetaError` naming the file and saying how to write one.
    """
    path = os.path.join(directory, META_FILE)
    if not os.path.isfile(path):
        raise MetaError(f"{path} does not exist: a data set needs it for its table sizes. Convert Criteo files with "
                        f"python -m datasets.criteo, or write {{\"cardinalities\": [C1 size, ..., C26 size]}} there")
    with open(path) as f:
        try:
            meta = json.load(f)
        except json.JSONDecodeError as err:
            raise MetaError(f"{path} is not JSON: {err}") from None
    sizes = meta.get("cardinalities")
    if not isinstance(sizes, list) or len(sizes) != len(CATEGORICAL) or \
            not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise MetaError(f"{path}: 'cardinalities' must list the {len(CATEGORICAL)} table sizes of C1..C26 "
                        f"(ints >= 1), got {sizes!r}")
    return meta
