"""Coalescing the sharded lookups that TensorFlow makes one column at a time.

``input_layer`` and Keras ``DenseFeatures`` look up each embedding column in
turn. Inside :func:`coalescing` a combined lookup of a sharded table does not
exchange at once: it records its request and returns a stand-in tensor. When
the block ends, one grouped exchange (:func:`collective.embedding.lookup.run`)
serves every recorded request and each stand-in's consumers are rewired to
the real vectors. TensorFlow's own code does everything else (pruning
invalid ids, empty rows, weights, reshapes), so the results are the
ungrouped ones. Eager code, ``tf.function`` bodies and lookups inside control
flow take the ungrouped path; a nested block joins the outer one.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, List, Optional, Tuple

import tensorflow as tf

from collective.embedding.lookup import Request, run
from collective.embedding.packed_group import seals_deferred
from collective.tf_internals import control_flow_context, func_graph

_state = threading.local()


def _pending() -> Optional[List[Tuple[tf.Tensor, Request]]]:
    return getattr(_state, "pending", None)


def can_defer() -> bool:
    """Whether a lookup made now may be deferred to the end of the current block."""
    if _pending() is None or tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    # A function body keeps even an unused placeholder: only plain graphs defer.
    return not isinstance(graph, func_graph.FuncGraph) and control_flow_context(graph) is None


def defer(request: Request) -> tf.Tensor:
    """Records ``request`` and returns the stand-in for its combined vectors."""
    stand_in = tf.compat.v1.placeholder(request.table.dtype.base_dtype, [None, request.info.dim],
                                        name="pending_sharded_lookup")
    _pending().append((stand_in, request))
    return stand_in


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """Defers the sharded combined lookups made in the block and serves them with one grouped exchange."""
    if _pending() is not None or tf.executing_eagerly():
        yield
        return
    _state.pending = []
    try:
        with seals_deferred():
            yield
        pending = _state.pending
    finally:
        _state.pending = None
    if pending:
        _resolve(pending)


def _resolve(pending: List[Tuple[tf.Tensor, Request]]) -> None:
    with tf.name_scope("grouped_sharded_lookup"):
        results = run([request for _, request in pending])
    for (stand_in, _), result in zip(pending, results):
        result.set_shape(stand_in.shape)
        for consumer in stand_in.consumers():
            for index, tensor in enumerate(consumer.inputs):
                if tensor.op is stand_in.op and tensor.value_index == stand_in.value_index:
                    consumer._update_input(index, result)  # pylint: disable=protected-access

