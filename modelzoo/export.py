"""Writes a SavedModel that plain TensorFlow serves from a model's logical variable values.

The serving graph is built once more in export mode (:func:`collective.modes.exporting`):
whole tables, no collectives, nothing of this package needed to serve it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from collective import modes
from modelzoo.heads import PREDICT

logger = logging.getLogger("modelzoo")


def _new_export_dir(base: str) -> str:
    stamp = int(time.time())
    while os.path.exists(os.path.join(base, str(stamp))):
        stamp += 1
    return os.path.join(base, str(stamp))


def write_saved_model(model_fn: Callable, params: Mapping, serving_input_receiver_fn: Callable,
                      values: Mapping[str, np.ndarray], export_dir_base: str) -> str:
    """Builds ``model_fn`` in PREDICT mode, loads ``values`` (by variable name) and saves; returns the path."""
    path = _new_export_dir(export_dir_base)
    with modes.exporting(), tf.Graph().as_default():
        receiver = serving_input_receiver_fn()
        spec = model_fn(receiver.features, None, PREDICT, params)
        variables = tf.compat.v1.global_variables()
        missing = [v.op.name for v in variables if v.op.name not in values]
        if missing:
            raise KeyError(f"no trained value for variable(s) {', '.join(missing)} of the serving graph; the "
                           "PREDICT graph must create the same variables as the TRAIN graph")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for var in variables:
                var.load(values[var.op.name], sess)
            signature = tf.compat.v1.saved_model.predict_signature_def(receiver.receiver_tensors, spec.predictions)
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(sess, [tf.compat.v1.saved_model.tag_constants.SERVING],
                                                 signature_def_map={"serving_default": signature},
                                                 main_op=tf.compat.v1.tables_initializer())
            builder.save()
    logger.info("exported a SavedModel to %s", path)
    return path
