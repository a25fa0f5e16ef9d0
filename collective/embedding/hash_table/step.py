"""The step a vocabulary policy counts: the graph's global step, moved by the optimizer that updates the table.

Training lookups stamp each key with the step (its last-seen step) and an
eviction run compares those stamps with the step after the update, so both
read one variable: the graph's global step. When the graph has none (Keras
optimizers count their own ``iterations``), the first policy lookup creates
it. After each update of a policy table (:func:`after_update`):

- a ``tf.compat.v1.train`` optimizer increments the global step when it is
  passed ``global_step=``; one not passed it is refused when the policy runs
  at intervals (another op moving the step would race with the run's read of
  it) or made the step, and otherwise leaves the step still;
- a Keras optimizer whose ``iterations`` is the global step increments it;
- a Keras optimizer with its own ``iterations``: when the policy created the
  global step, it is set to ``iterations`` after each update (the step the
  program advances); when the program owns it, building the update fails,
  since whatever else moves that step would race with the policy's reads.
"""

from __future__ import annotations

import logging
from typing import List

import tensorflow as tf

from collective.tf_internals import keras_optimizers

logger = logging.getLogger("collective.embedding")

POLICY_STEP_COLLECTION = "collective_policy_made_global_step"
"""Holds the global step when a vocabulary policy created it (the graph had none)."""


def step_variable(table: str) -> tf.Variable:
    """The graph's global step; created (at the root scope) when the graph has none."""
    step = tf.compat.v1.train.get_global_step()
    if step is not None:
        return step
    with tf.compat.v1.variable_scope(tf.compat.v1.VariableScope(False, name=""), auxiliary_name_scope=False):
        step = tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.add_to_collection(POLICY_STEP_COLLECTION, step)
    logger.info("hash table %s: its vocabulary policy counts steps on the global step, which the graph lacked; "
                "created %s (a Keras optimizer's update count moves it)", table, step.op.name)
    return step


def _read(step) -> tf.Tensor:
    value = step.read_value() if hasattr(step, "read_value") else tf.identity(step)
    return tf.cast(value, tf.int64)


def value(table: str, create: bool = True) -> tf.Tensor:
    """The policy's step now (int64); without ``create``, 0 when the graph has no global step."""
    if not create and tf.compat.v1.train.get_global_step() is None:
        return tf.constant(0, tf.int64)
    return _read(step_variable(table))


def _policy_made(step) -> bool:
    return any(s is step for s in tf.compat.v1.get_collection(POLICY_STEP_COLLECTION))


def after_update(optimizer, table: str, after: List, global_step=None, interval: bool = False) -> tf.Tensor:
    """The policy's step once ``optimizer``'s update (``after``) has run, moved as the module docstring says.

    ``interval``: an eviction run at an interval reads the step after this update.

    Raises:
      ValueError: naming ``table`` and the optimizer, when a Keras optimizer does not move a global step the
        program owns, or a ``tf.compat.v1.train`` optimizer is not given the global step the policy created, or
        not given the program's global step while an interval run reads it.
    """
    step = step_variable(table)
    name = getattr(optimizer, "_name", None) or type(optimizer).__name__
    with tf.control_dependencies(after):
        if not isinstance(optimizer, keras_optimizers):
            if global_step is None and _policy_made(step):
                raise ValueError(
                    f"hash table {table}: its vocabulary policy counts the global step, and optimizer {name} is "
                    "not given one, so the step never moves and no eviction is ever due; pass "
                    "global_step=tf.compat.v1.train.get_or_create_global_step() to minimize()/apply_gradients()")
            if global_step is None and interval:
                raise ValueError(
                    f"hash table {table}: its vocabulary policy runs its eviction at intervals of the global step "
                    f"{step.op.name}, read after each update of the table, and optimizer {name} that updates it is "
                    "not given global_step=: whatever moves the step (another optimizer's "
                    "minimize(global_step=...), an assign_add) would run in parallel with that read, so which runs "
                    "are due would differ between runs and workers. Pass global_step=tf.compat.v1.train."
                    "get_global_step() to this optimizer's minimize()/apply_gradients() and not to the other "
                    "optimizer of the same train op (the step must move once per step), or evict at checkpoints "
                    "only (evict_every_steps=None, evict_at_checkpoint=True)")
            return _read(step)
        iterations = optimizer.iterations
        if iterations is step:
            return _read(step)
        if not _policy_made(step):
            raise ValueError(
                f"hash table {table}: its vocabulary policy counts the global step {step.op.name}, and Keras "
                f"optimizer {name} that updates it counts its own iterations ({iterations.name}), so the policy's "
                "step would not move with the updates. Before the optimizer's first update set "
                "optimizer.iterations = tf.compat.v1.train.get_global_step() (it then increments the global step "
                "once per update; drop any separate global_step.assign_add), or build the model without a global "
                "step (the policy then makes one that follows the optimizer's iterations)")
        moved = step.assign(tf.cast(iterations, step.dtype.base_dtype), read_value=False)
    with tf.control_dependencies([moved]):
        return _read(step)
