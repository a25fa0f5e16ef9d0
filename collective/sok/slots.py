"""Optimizer slots of SOK tables in Keras checkpoints: each slot saved and restored as its table's logical rows.

A slot of a SOK table (Adam's ``m``/``v``, momentum, Adagrad's accumulator)
is this worker's rows of the slot, an ordinary variable inside the optimizer;
left alone, a checkpoint stores worker 0's copy and every worker reads it.
:func:`watch` (called by ``sok.OptimizerWrapper`` and ``sok.optimizers``)
makes an optimizer create each slot of a SOK table under a variable creator
that gives the slot its table's checkpoint hooks
(:func:`collective.sok.checkpoint.save_logical`) before the optimizer tracks
it, so a restore waiting for the slot (a checkpoint read before the first
step) already goes through them. The slot-creating methods of Keras
optimizers (``add_variable_from_reference``), legacy Keras optimizers
(``add_slot``) and ``tf.compat.v1.train`` optimizers (``_zeros_slot``,
``_get_or_make_slot*``) name the table, so a slot is never matched by name.

A slot not shaped like its table (Adafactor's factored moments) has no rows
to reshard: a save of a checkpoint holding it fails naming table and optimizer.
"""

from __future__ import annotations

import functools
import logging
from typing import Dict, Iterable, Optional

import tensorflow as tf

from collective.embedding.table import shard_of
from collective.sok.checkpoint import refuse_save, restore_hash_slot, restore_table, save_logical

logger = logging.getLogger("collective.sok")

_CREATE_SLOT = ("add_variable_from_reference", "add_slot", "_zeros_slot", "_get_or_make_slot",
                "_get_or_make_slot_with_initializer")
_PRIMARY = ("model_variable", "var")  # the table argument's keyword in those methods


def is_keras_optimizer(optimizer) -> bool:
    """Whether ``optimizer`` is a Keras optimizer of TF 2.11+ (``tf.keras.optimizers.*``, not ``.legacy``)."""
    return hasattr(optimizer, "_var_key") and hasattr(optimizer, "add_variable_from_reference")


def watch(optimizer):
    """Makes ``optimizer`` give each slot it creates for a SOK table that table's checkpoint hooks; returns it."""
    state = optimizer.__dict__
    if state.get("_collective_sok_watched"):
        return optimizer
    for name in _CREATE_SLOT:
        method = getattr(optimizer, name, None)
        if callable(method):
            state[name] = _hooking_slots(optimizer, method)
    state["_collective_sok_watched"] = True
    return optimizer


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
    if slot.__dict__.get("_collective_slot_of") is not None:
        return slot
    slot._collective_slot_of = table  # pylint: disable=protected-access
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
    return save_logical(slot, info, where, functools.partial(restore_hash_slot, initial=initial, where=where))


def _hooking_slots(optimizer, create):
    """``create`` (a slot-creating method) with the slots it makes for a SOK table hooked as they are made."""
    @functools.wraps(create)
    def create_slot(*args, **kwargs):
        table = args[0] if args else next((kwargs[k] for k in _PRIMARY if k in kwargs), None)
        if shard_of(table) is None:
            return create(*args, **kwargs)

        def hooking_creator(next_creator, **options):
            return hook(next_creator(**options), table, optimizer, created=True)

        with tf.variable_creator_scope(hooking_creator):
            return create(*args, **kwargs)

    return create_slot


def _initial_row(slot: tf.Variable) -> Optional[tf.Tensor]:
    """The value every row of a new slot starts with; None when the rows start unequal (a copy of the table)."""
    if tf.executing_eagerly():
        first = tf.identity(slot[0])
        return first if bool(tf.reduce_all(tf.equal(slot, first[None]))) else None
    if not tf.inside_function():  # TF1 graph: the initial value's first row
        return tf.gather(slot.initial_value, 0)
    return None
