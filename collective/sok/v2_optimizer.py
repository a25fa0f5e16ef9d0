"""SOK v2's ``sok.OptimizerWrapper``: a TensorFlow optimizer applying SOK variables' sparse gradients.

A SOK variable's gradient reaches it as ``IndexedSlices`` already summed over
the workers that read its rows (the exchange's backward pass), so the wrapper
applies it locally, without any further aggregation; the wrapped optimizer's
own sparse update runs on this worker's rows and slots. The optimizer's
slots of SOK variables checkpoint as their tables do (:mod:`collective.sok.slots`).
It marks the rows it updates, with their update time, for
``sok.incremental_dump`` and incremental checkpoints (:mod:`collective.checkpoint.touched`).
"""

from __future__ import annotations

from typing import Dict, Iterable, Tuple

import tensorflow as tf

from collective.checkpoint import touched
from collective.embedding import tables
from collective.embedding.hash_table import growth
from collective.embedding.table import shard_of
from collective.sok import slots as sok_slots
from collective.tf_internals import patches


class OptimizerWrapper:
    """``sok.OptimizerWrapper(tf_optimizer)``: ``apply_gradients`` on ``(grad, sok variable)`` pairs.

    Takes a Keras optimizer (``tf.keras.optimizers.Adam``, ``SGD``, ...) or a
    TF1 one (``tf.compat.v1.train.AdamOptimizer``, ...).
    """

    def __init__(self, optimizer):
        self._optimizer = sok_slots.watch(optimizer)
        # A growing DynamicVariable's slots grow before its rows are updated, inside scope() or not.
        tables.watch_slots(optimizer, growth.remember_slot)
        growth.watch_updates(optimizer)

    @property
    def optimizer(self):
        """The wrapped TensorFlow optimizer."""
        return self._optimizer

    def apply_gradients(self, grads_and_vars: Iterable[Tuple], **kwargs):
        """Applies each gradient to its SOK variable on this worker's rows and marks the rows updated."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        for _, var in pairs:
            if shard_of(var) is None:
                raise ValueError(f"sok.OptimizerWrapper.apply_gradients: '{var.name}' is not a SOK variable; "
                                 "split with sok.filter_variables and give the others to a plain optimizer")
        if sok_slots.is_keras_optimizer(self._optimizer):
            applied = self._optimizer.apply_gradients(pairs, skip_gradients_aggregation=True, **kwargs)
        else:
            applied = self._optimizer.apply_gradients(pairs, **kwargs)
        sok_slots.hook_slots(self._optimizer, [v for _, v in pairs])  # slots made before the wrapper saw them
        if patches.active():  # inside CollectiveStrategy.scope() the optimizer's own apply_gradients marks them
            return applied
        return touched.applied_and_marked(self._optimizer, pairs, applied)

    def slots(self, var) -> Dict[str, tf.Variable]:
        """``{slot name: slot variable}`` of ``var`` (shaped like its local rows); empty before the first step."""
        return sok_slots.slot_variables(self._optimizer, var)

    def __getattr__(self, name):
        return getattr(self.__dict__["_optimizer"], name)
