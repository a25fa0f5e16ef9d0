"""``sok.optimizers.Adam`` and ``LazyAdamOptimizer`` for embedding variables.

Both are Keras optimizers working on each worker's rows. Gradients reach the
embedding variables as ``IndexedSlices`` already summed over the workers that
read the rows, so they must not be aggregated again
(``experimental_aggregate_gradients=False``, as SOK's recipes pass). Their
slots of SOK tables checkpoint as the tables do (:mod:`collective.sok.slots`).
"""

from __future__ import annotations

import tensorflow as tf

from collective.sok.slots import watch


class Adam(tf.keras.optimizers.Adam):
    """SOK's Adam: Keras Adam (every row's moments decay each step, as dense Adam)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        watch(self)


class LazyAdamOptimizer(tf.keras.optimizers.Adam):
    """Adam that updates only the rows in a sparse gradient: their moments and values, nothing else.

    Dense gradients get ordinary Adam. ``amsgrad`` is not supported.
    """

    # Incremental checkpoints (collective.checkpoint.touched): only the gradient's rows change.
    collective_updates_only_gradient_rows = True

    def __init__(self, *args, amsgrad: bool = False, **kwargs):
        if amsgrad:
            raise ValueError("LazyAdamOptimizer does not support amsgrad=True; use sok.optimizers.Adam")
        super().__init__(*args, **kwargs)
        watch(self)

    def update_step(self, gradient, variable):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        rows, position = tf.unique(tf.cast(gradient.indices, tf.int64))
        values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(rows)[0])
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        alpha = tf.cast(self.learning_rate, dtype) * tf.sqrt(1 - tf.pow(beta_2, step)) / (1 - tf.pow(beta_1, step))
        index = self._index_dict[self._var_key(variable)]
        m, v = self._momentums[index], self._velocities[index]
        m_rows = beta_1 * tf.gather(m, rows) + (1 - beta_1) * values
        v_rows = beta_2 * tf.gather(v, rows) + (1 - beta_2) * tf.square(values)
        m.scatter_update(tf.IndexedSlices(m_rows, rows))
        v.scatter_update(tf.IndexedSlices(v_rows, rows))
        variable.scatter_sub(tf.IndexedSlices(alpha * m_rows / (tf.sqrt(v_rows) + self.epsilon), rows))


__all__ = ["Adam", "LazyAdamOptimizer"]
