"""Packed tables (``COLLECTIVE_PACKING=1``, docs/packing.md) where a program uses its tables as variables.

A packed table is a :class:`~collective.embedding.packed_group.PackedTable`,
rows of its group's variable, not a variable. Inside ``scope()``:

- ``optimizer.get_slot(table, name)`` (``tf.compat.v1.train``, ``hb.train``
  and legacy Keras optimizers) gives the table's rows of its group's slot
  (:func:`collective.embedding.packed_tables.slot_view`), named as the
  unpacked table's slot, fetchable and saveable as it is;
- ``tf.compat.v1.global_variables()`` lists each packed table where its
  group's variable stands (and the tables not looked up yet), so a program
  that finds its table by name (``v.op.name``) finds it; the listing can be
  given to ``variables_initializer``, ``report_uninitialized_variables`` and
  a ``Saver`` (each table saved once, under its own name). The group's slots
  stay listed; ``trainable_variables()`` and the ``GLOBAL_VARIABLES``
  collection still hold the group variable, which is what TensorFlow's own
  code (default initializers and Savers, moving averages) takes.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from collective.embedding import packed_tables
from collective.tf_internals import variables


def get_slot(optimizer, get: Callable, var, *args, **kwargs):  # pylint: disable=unused-argument
    """``get(var, name)`` (an optimizer's ``get_slot``); of a packed table, its rows of its group's slot."""
    return packed_tables.get_slot(get, var, *args, **kwargs)


def global_variables(scope: Optional[str] = None) -> List:
    """``tf.compat.v1.global_variables(scope)`` listing each packed table in place of its group's variable."""
    return packed_tables.listing(variables.global_variables(), scope)
