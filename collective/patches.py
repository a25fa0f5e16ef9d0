"""Every change collective makes to TensorFlow, in one place.

While a :func:`patched` block is active (``CollectiveStrategy.scope()``),
these module attributes are replaced; leaving the block restores the
originals exactly. Nested blocks share one installation.

========================================================  =====================================================
``embedding_ops.embedding_lookup``                        lookups on sharded tables go through the exchange
``tf.compat.v1.nn.embedding_lookup``                      the same, under its public v1 name
``embedding_ops.embedding_lookup_sparse_impl``            combined lookups (``embedding_lookup_sparse``, the
                                                          ``safe_`` variant, feature columns) likewise
``variable_v1.default_variable_creator``                  dense variables start as rank 0's values
``variables.default_variable_creator_v2``                 the same for ``tf.Variable``
``optimizer.Optimizer.apply_gradients``                   dense gradients averaged over workers, sharded
                                                          gradients scaled for a global mean
``feature_column._internal_input_layer``                  ``input_layer``: sharded lookups of all columns in
                                                          one grouped exchange
``DenseFeatures.call`` (Keras, v1 and v2)                 the same for Keras ``DenseFeatures``
``_SharedEmbeddingColumn._get_dense_tensor_internal``     v1 shared columns accept their sharded table
``monitored_session.MonitoredTrainingSession`` (and the   every worker creates its session as a chief and saves
``tf.compat.v1.train`` name)                              checkpoints with the others; rank 0 alone writes
                                                          summaries (``collective.session``)
``saver._get_saver_or_default``                           a default ``Scaffold`` saves whole logical tables
                                                          (``collective.checkpoint.Saver``)
========================================================  =====================================================
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Iterator, List, Tuple

import tensorflow as tf
from tensorflow.python.ops import embedding_ops, variable_v1, variables
from tensorflow.python.training import monitored_session
from tensorflow.python.training import optimizer as optimizer_lib
from tensorflow.python.training import saver as saver_lib

_lock = threading.Lock()
_depth = 0
_saved: Dict[Tuple[object, str], object] = {}


def _targets() -> List[Tuple[object, str, Callable]]:
    from keras.src.feature_column import dense_features  # pylint: disable=import-outside-toplevel
    from tensorflow.python.feature_column import feature_column as fc_v1  # pylint: disable=import-outside-toplevel

    from collective import lookups, session, training  # pylint: disable=import-outside-toplevel
    from collective import feature_columns  # pylint: disable=import-outside-toplevel

    return [
        (embedding_ops, "embedding_lookup", lookups.embedding_lookup),
        (tf.compat.v1.nn, "embedding_lookup", lookups.embedding_lookup),
        (embedding_ops, "embedding_lookup_sparse_impl", lookups.embedding_lookup_sparse_impl),
        (variable_v1, "default_variable_creator", training.broadcasting_creator_v1),
        (variables, "default_variable_creator_v2", training.broadcasting_creator_v2),
        (optimizer_lib.Optimizer, "apply_gradients", training.averaging_apply_gradients),
        (monitored_session, "MonitoredTrainingSession", session.MonitoredTrainingSession),
        (tf.compat.v1.train, "MonitoredTrainingSession", session.MonitoredTrainingSession),
        (saver_lib, "_get_saver_or_default", session.default_saver),
        (fc_v1, "_internal_input_layer", feature_columns.internal_input_layer),
        (dense_features.DenseFeatures, "call", feature_columns.dense_features_call),
        (fc_v1._SharedEmbeddingColumn, "_get_dense_tensor_internal",  # pylint: disable=protected-access
         feature_columns.shared_embedding_dense_tensor),
    ]


def original(owner: object, name: str):
    """The attribute as TensorFlow defines it, whether or not it is patched now."""
    return _saved.get((owner, name), owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name))


def active() -> bool:
    """Whether collective's patches are installed."""
    return _depth > 0


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Installs the patches for the duration of the block."""
    global _depth
    with _lock:
        if _depth == 0:
            for owner, name, replacement in _targets():
                _saved[(owner, name)] = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
                setattr(owner, name, replacement)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for (owner, name), value in _saved.items():
                    setattr(owner, name, value)
                _saved.clear()


@contextlib.contextmanager
def suspended(names: Tuple[str, ...] = ("default_variable_creator", "default_variable_creator_v2",
                                        "apply_gradients")) -> Iterator[None]:
    """TensorFlow's originals of the patched attributes ``names`` for the block (default: creators, optimizer).

    Export builds its graph with the variable creators and optimizer
    restored (no broadcast of initial values enters a SavedModel) while the
    lookups stay routed (hash-table export variables need them).
    """
    with _lock:
        keys = [key for key in _saved if key[1] in names]
        replaced = {key: (key[0].__dict__[key[1]] if isinstance(key[0], type) else getattr(*key)) for key in keys}
        for owner, name in keys:
            setattr(owner, name, _saved[(owner, name)])
    try:
        yield
    finally:
        with _lock:
            for (owner, name), value in replaced.items():
                setattr(owner, name, value)
