"""Graph-building modes that change what ``embedding_scope()`` builds.

Export builds the model once more, in a plain TensorFlow graph with whole
tables and no collectives, so that a SavedModel serves without this package
or Horovod. Code that builds sharded state (the sharding getter, hash-table
columns) asks :func:`is_exporting` and builds the plain form instead.

Hash-table vocabularies have no fixed size: the export code reads how many
keys each one holds from the checkpoint and passes those sizes here, and the
hash-table code reads them with :func:`export_rows`. In export mode a
hash-table lookup is a ``tf.lookup`` table from key to row (registered in the
collection ``EXPORT_HASH_INDEXES`` as ``(table_name, lookup_table)``) plus a
``[rows, dim]`` variable named as the table.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator, Mapping, Optional

EXPORT_HASH_INDEXES = "collective_export_hash_indexes"

_state = threading.local()


def is_exporting() -> bool:
    """True while a SavedModel export is building its graph."""
    return getattr(_state, "export_rows", None) is not None


def export_rows(table_name: str) -> int:
    """Keys the checkpoint holds for the hash-table vocabulary ``table_name`` (0 when it holds none)."""
    rows: Optional[Dict[str, int]] = getattr(_state, "export_rows", None)
    if rows is None:
        raise RuntimeError("export_rows() is only meaningful inside modes.exporting()")
    return int(rows.get(table_name, 0))


@contextlib.contextmanager
def exporting(hash_table_rows: Optional[Mapping[str, int]] = None) -> Iterator[None]:
    """Export mode for the graph built inside the block.

    Args:
      hash_table_rows: keys held per hash-table vocabulary, by table name.
    """
    previous = getattr(_state, "export_rows", None)
    _state.export_rows = dict(hash_table_rows or {})
    try:
        yield
    finally:
        _state.export_rows = previous
