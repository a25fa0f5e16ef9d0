"""How a hash table's variables are made and named: per-worker variables that no sharding getter touches."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import tensorflow as tf


def full_name(name: str) -> str:
    """``name`` in the current variable scope."""
    scope = tf.compat.v1.get_variable_scope().name
    return f"{scope}/{name}" if scope else name


def op_name(name: str) -> str:
    """``name`` usable as (part of) an op name."""
    return name.replace("/", "_").replace(":", "_")


def eager_variable(name: str, shape: Sequence[int], dtype: tf.DType, initializer,
                   trainable: bool = False) -> tf.Variable:
    """A hash table's variable in TF2 eager code (Keras builds layers eagerly, also under ``tf.function``)."""
    return tf.Variable(initializer(shape, dtype=dtype), trainable=trainable, name=name, dtype=dtype)


def plain_variable(name: str, shape: Sequence[Optional[int]], dtype: tf.DType, initializer, collections: Iterable[str],
                   trainable: bool = False) -> tf.Variable:
    """``get_variable`` in the current scope with its custom getters and partitioner switched off.

    Inside ``embedding_scope()`` a 2-D trainable variable would otherwise be
    re-sharded as a ``[vocab, dim]`` table; a hash table's variables are
    already per-worker. Trainable ones are created non-trainable (so no
    variable creator shards them) and then marked trainable. A ``shape``
    with unknown dimensions needs an ``initializer`` that takes no arguments.
    """
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), auxiliary_name_scope=False) as scope:
        scope.set_custom_getter(None)
        scope.set_partitioner(None)
        var = tf.compat.v1.get_variable(name, shape=shape, dtype=dtype, initializer=initializer, trainable=False,
                                        collections=list(collections), use_resource=True)
    if trainable:
        # Per instance, not a patch: this one variable must be trainable without having passed the creators.
        var._trainable = True  # pylint: disable=protected-access
        if var not in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, var)
    return var
