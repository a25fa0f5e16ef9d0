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
  are listed as the tables' slots (``<table>/Adagrad``, what ``get_slot``
  gives). ``tf.compat.v1.trainable_variables()`` lists the tables the
  same way (a program's L2 term or ``var_list`` of its tables). The
  ``GLOBAL_VARIABLES`` and ``TRAINABLE_VARIABLES`` collections still hold
  the group variable, which is what TensorFlow's own code (default
  initializers and Savers, moving averages, ``compute_gradients`` without a
  ``var_list``) takes.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import tensorflow as tf

from collective.embedding import packed_tables, tables
from collective.embedding.packed_group import PackedTable
from collective.tf_internals import variables


def get_slot(optimizer, get: Callable, var, *args, **kwargs):  # pylint: disable=unused-argument
    """``get(var, name)`` (an optimizer's ``get_slot``); of a packed table, its rows of its group's slot."""
    return packed_tables.get_slot(get, var, *args, **kwargs)


def global_variables(scope: Optional[str] = None) -> List:
    """``tf.compat.v1.global_variables(scope)`` listing each packed table in place of its group's variable."""
    return packed_tables.listing(variables.global_variables(), scope)


def trainable_variables(scope: Optional[str] = None) -> List:
    """``tf.compat.v1.trainable_variables(scope)`` listing each packed table in place of its group's variable."""
    return packed_tables.listing(variables.trainable_variables(), scope)


def moving_average_apply(ema, apply: Callable, var_list=None):
    """``ExponentialMovingAverage.apply(var_list)`` where packed tables have a shadow each: a variable of the
    table's rows named ``<table>/<ema.name>``, starting at the table's value (its initial value before the
    initializer has run, as TensorFlow's shadow of a variable does), kept and saved as the table's rows; the
    default ``var_list`` is :func:`trainable_variables` (the tables, not their group's variable)."""
    if var_list is None:
        var_list = trainable_variables()
    for table in var_list:
        if isinstance(table, PackedTable) and table.ref() not in ema._averages:  # pylint: disable=protected-access
            ema._averages[table.ref()] = _shadow(table, ema.name)  # pylint: disable=protected-access
    return apply(var_list)


def _shadow(table: PackedTable, name: str) -> tf.Variable:
    group = table.group.variable
    offset = table.sealed_offset()
    with tf.init_scope(), tf.compat.v1.get_default_graph().name_scope(None), tables.deriving(table):
        initial = tf.cond(group.is_initialized(), table.read_value,
                          lambda: tf.slice(group.initial_value, [offset, 0], [table.rows, -1]))
        shadow = tf.compat.v1.Variable(initial, trainable=False, name=f"{table.name}/{name}", use_resource=True)
    return tables.tag_derived(shadow, table)


def moving_average_variables_to_restore(ema, original: Callable, moving_avg_variables=None):
    """``ExponentialMovingAverage.variables_to_restore()`` naming each packed table's shadow
    (``<table>/<ema.name>``) for the table (by default the tables of :func:`trainable_variables`, not their
    group's variable), as one process's names its table's."""
    if moving_avg_variables is None:
        moving_avg_variables = trainable_variables() + variables.moving_average_variables()
    return original(moving_avg_variables)


def moving_average_name(ema, original: Callable, var) -> str:
    """``ExponentialMovingAverage.average_name(var)``; of a packed table (whose ``name`` has no ``:0``),
    ``<table>/<ema.name>``, the name one process's shadow of the table has."""
    if isinstance(var, PackedTable) and var.ref() not in ema._averages:  # pylint: disable=protected-access
        return tf.compat.v1.get_default_graph().unique_name(f"{var.name}/{ema.name}", mark_as_used=False)
    return original(var)
