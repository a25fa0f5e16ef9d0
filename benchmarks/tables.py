"""The rows of a benchmark run's tables (its ``scale`` and ``tables`` keys), for the config and the models alike."""

from __future__ import annotations

from typing import Any, Mapping, Tuple

from datasets import schema
from datasets.synthetic import cardinalities


def table_sizes(spec: Mapping[str, Any]) -> Tuple[int, ...]:
    """Rows of a run's tables: Criteo Kaggle's at ``scale``, the first ``tables`` of the 26 (all 26 in a record
    written before the key existed)."""
    return tuple(cardinalities(float(spec["scale"])))[:int(spec.get("tables", len(schema.CATEGORICAL)))]
