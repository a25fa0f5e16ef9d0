"""Packed tables (``COLLECTIVE_PACKING=1``, docs/packing.md) where a program uses its tables as variables.

A packed table is a :class:`~collective.embedding.packed_group.PackedTable`,
rows of its group's variable, not a variable. Inside ``scope()``:

- ``optimizer.get_slot(table, name)`` (``tf.compat.v1.train``, ``hb.train``
  and legacy Keras optimizers) gives the table's rows of its group's slot
  (:func:`collective.embedding.packed_tables.slot_view`), named as the
  unpacked table's slot, fetchable and saveable as it is.
"""

from __future__ import annotations

from typing import Callable

from collective.embedding import packed_tables
from collective.embedding.packed_group import PackedTable


def get_slot(optimizer, get: Callable, var, *args, **kwargs):  # pylint: disable=unused-argument
    """``get(var, name)`` (an optimizer's ``get_slot``); of a packed table, its rows of its group's slot."""
    if not isinstance(var, PackedTable):
        return get(var, *args, **kwargs)
    slot = get(var.group.variable, *args, **kwargs)
    return None if slot is None else packed_tables.slot_view(slot, var)

