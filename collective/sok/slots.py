"""Optimizer slots of SOK tables in Keras checkpoints: each slot saved and restored as its table's logical rows.

A slot of a SOK table (Adam's ``m``/``v``, momentum, Adagrad's accumulator)
is this worker's rows of the slot, an ordinary variable inside the optimizer;
left alone, a checkpoint stores worker 0's copy and every worker reads it.
:func:`watch` (called by ``sok.OptimizerWrapper`` and ``sok.optimizers``)
makes an optimizer give each slot of a SOK table its table's checkpoint hooks
(:func:`collective.sok.checkpoint.save_logical`) as it is created
(:func:`collective.embedding.tables.watch_slots`, which knows the table by
the object the slot-creating method received, never by name), before the
optimizer tracks it, so a restore waiting for the slot (a checkpoint read
before the first step) already goes through them.

A slot not shaped like its table (Adafactor's factored moments) has no rows
to reshard: a save of a checkpoint holding it fails naming table and optimizer.
"""

from __future__ import annotations

import functools
import logging
from typing import Dict, Iterable, Optional

import tensorflow as tf

from collective.embedding import tables
from collective.embedding.table import shard_of
from collective.sok.checkpoint import refuse_save, restore_hash_slot, restore_table, save_logical

logger = logging.getLogger("collective.sok")


def is_keras_optimizer(optimizer) -> bool:
    """Whether ``optimizer`` is a Keras optimizer of TF 2.11+ (``tf.keras.optimizers.*``, not ``.legacy``)."""
    return hasattr(optimizer, "_var_key") and hasattr(optimizer, "add_variable_from_reference")


def watch(optimizer):
    """Makes ``optimizer`` give each slot it creates for a SOK table that table's checkpoint hooks; returns it."""
    return tables.watch_slots(optimizer, functools.partial(_hook_created, optimizer))


def _hook_created(optimizer, slot: tf.Variable, table: tf.Variable) -> tf.Variable:
    return hook(slot, table, optimizer, created=True)


def hook_slots(optimizer, variables: Iterable) -> None:
    """Hooks the slots ``optimizer`` already holds for the SOK tables among ``variables`` (made before :func:`watch`).

    Their initial value is unknown: a restore into such a slot of a hash table is refused. A Keras
    optimizer's per-variable state not shaped like the table (made by ``add_variable``, as Adafactor's
    factored moments) gets the save-time refusal.
    """
    for var in variables:
        if shard_of(var) is not None:
            for slot in slot_variables(optimizer, var, any_shape=True).values():
                hook(slot, var, optimizer, created=False)


def slot_variables(optimizer, var, any_shape: bool = False) -> Dict[str, tf.Variable]:
    """``{slot name: slot variable}`` that ``optimizer`` holds for ``var``, shaped like it; empty before they exist.

    ``any_shape``: also a Keras optimizer's per-variable state of other shapes.
    """
    if is_keras_optimizer(optimizer):
        index = getattr(optimizer, "_index_dict", {}).get(optimizer._var_key(var))  # pylint: disable=protected-access
        if index is None:
            return {}
        found = {}
        for attr, value in sorted(vars(optimizer).items()):
            if attr in ("_variables", "_trainable_variables") or not isinstance(value, list) or \
                    len(value) <= index or not all(isinstance(x, tf.Variable) for x in value):
                continue
            slot = value[index]
            if slot is not var and (any_shape or slot.shape == var.shape):
                found[attr.strip("_")] = slot
        return found
    return {name: optimizer.get_slot(var, name) for name in optimizer.get_slot_names()
            if optimizer.get_slot(var, name) is not None}


def hook(slot: tf.Variable, table: tf.Variable, optimizer, created: bool) -> tf.Variable:
    """Gives ``slot`` (of SOK table ``table``) its table's checkpoint hooks, or a save-time refusal."""
    if slot.__dict__.get("_collective_sok_hooked"):
        return slot
    slot._collective_sok_hooked = True  # pylint: disable=protected-access
    info = shard_of(table)
    kind = type(optimizer).__name__
    where = f"optimizer slot '{slot.name}' ({kind}) of SOK table {info.name}"
    if tuple(slot.shape) != tuple(table.shape):
        return refuse_save(slot, (
            f"{where} is shaped {tuple(slot.shape)}, not like the table's rows {tuple(table.shape)}: a checkpoint "
            "cannot save it as the table's logical rows, and worker 0's copy would restore wrongly on the other "
            f"workers. Leave the {kind} out of the checkpoint (tf.train.Checkpoint(model=model)), or train SOK "
            "tables with an optimizer whose slots are shaped like the table (Adam, SGD with momentum, Adagrad, "
            "...), which checkpoints and sok.dump/sok.load(path, variables, optimizer) reshard"))
    if info.hash_index is None:
        return save_logical(slot, info, where, restore_table)
    initial = _initial_row(slot) if created else None
    slot._collective_initial_row = initial  # pylint: disable=protected-access  (sok.load resets rows to it)
    return save_logical(slot, info, where, functools.partial(restore_hash_slot, initial=initial, where=where))


def initial_row(slot: tf.Variable) -> Optional[tf.Tensor]:
    """The row every row of ``slot`` started with when :func:`hook` saw it created; None when it is not known."""
    return slot.__dict__.get("_collective_initial_row")


def _initial_row(slot: tf.Variable) -> Optional[tf.Tensor]:
    """The value every row of a new slot starts with; None when the rows start unequal (a copy of the table)."""
    if tf.executing_eagerly():
        first = tf.identity(slot[0])
        return first if bool(tf.reduce_all(tf.equal(slot, first[None]))) else None
    if not tf.inside_function():  # TF1 graph: the initial value's first row
        return tf.gather(slot.initial_value, 0)
    return None
