"""SOK v2's ``sok.OptimizerWrapper``: a TensorFlow optimizer applying SOK variables' sparse gradients.

A SOK variable's gradient reaches it as ``IndexedSlices`` already summed over
the workers that read its rows (the exchange's backward pass), so the wrapper
applies it locally, without any further aggregation; the wrapped optimizer's
own sparse update runs on this worker's rows and slots.
"""

from __future__ import annotations

from typing import Dict, Iterable, Tuple

import tensorflow as tf

from collective.embedding.table import shard_of


def _is_keras_optimizer(optimizer) -> bool:
    return hasattr(optimizer, "_var_key") and hasattr(optimizer, "_index_dict")


class OptimizerWrapper:
    """``sok.OptimizerWrapper(tf_optimizer)``: ``apply_gradients`` on ``(grad, sok variable)`` pairs.

    Takes a Keras optimizer (``tf.keras.optimizers.Adam``, ``SGD``, ...) or a
    TF1 one (``tf.compat.v1.train.AdamOptimizer``, ...).
    """

    def __init__(self, optimizer):
        self._optimizer = optimizer

    @property
    def optimizer(self):
        """The wrapped TensorFlow optimizer."""
        return self._optimizer

    def apply_gradients(self, grads_and_vars: Iterable[Tuple], **kwargs):
        """Applies each gradient to its SOK variable on this worker's rows."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        for _, var in pairs:
            if shard_of(var) is None:
                raise ValueError(f"sok.OptimizerWrapper.apply_gradients: '{var.name}' is not a SOK variable; "
                                 "split with sok.filter_variables and give the others to a plain optimizer")
        if _is_keras_optimizer(self._optimizer):
            return self._optimizer.apply_gradients(pairs, skip_gradients_aggregation=True, **kwargs)
        return self._optimizer.apply_gradients(pairs, **kwargs)

    def slots(self, var) -> Dict[str, tf.Variable]:
        """``{slot name: slot variable}`` of ``var`` (shaped like its local rows); empty before the first step."""
        opt = self._optimizer
        if _is_keras_optimizer(opt):
            index = opt._index_dict.get(opt._var_key(var))  # pylint: disable=protected-access
            if index is None:
                return {}
            found = {}
            for attr, value in sorted(vars(opt).items()):
                if attr in ("_variables", "_trainable_variables") or not isinstance(value, list) or \
                        len(value) <= index or not all(isinstance(x, tf.Variable) for x in value):
                    continue
                slot = value[index]
                if slot is not var and slot.shape == var.shape:
                    found[attr.strip("_")] = slot
            return found
        return {name: opt.get_slot(var, name) for name in opt.get_slot_names() if opt.get_slot(var, name) is not None}

    def __getattr__(self, name):
        return getattr(self.__dict__["_optimizer"], name)
