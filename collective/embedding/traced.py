"""Graph functions traced once per process and called in every graph.

A ``tf.function`` called while building a graph traces again in each new
graph (its trace cache is keyed by the graph), and the loops of the
library's shared functions cost about a tenth of a second each to trace. An
Estimator builds a graph per ``train``, ``evaluate`` and ``predict`` call, so
the same loops were traced again and again. A concrete function traced once,
in a graph of its own, is added to each graph that calls it instead.
"""

from __future__ import annotations

import functools

import tensorflow as tf


@functools.lru_cache(maxsize=None)
def once(function):
    """``function`` (a ``tf.function`` with an ``input_signature`` and nothing captured) as one concrete
    function, traced on first use; it can be called in any graph, inside a ``tf.function`` or eagerly."""
    with tf.Graph().as_default():
        return function.get_concrete_function()
