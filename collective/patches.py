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
========================================================  =====================================================
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Dict, Iterator, List, Tuple

import tensorflow as tf
from tensorflow.python.ops import embedding_ops, variable_v1, variables
from tensorflow.python.training import optimizer as optimizer_lib

_lock = threading.Lock()
_depth = 0
_saved: Dict[Tuple[object, str], object] = {}


def _targets() -> List[Tuple[object, str, Callable]]:
    from collective import lookups, training  # pylint: disable=import-outside-toplevel

    return [
        (embedding_ops, "embedding_lookup", lookups.embedding_lookup),
        (tf.compat.v1.nn, "embedding_lookup", lookups.embedding_lookup),
        (embedding_ops, "embedding_lookup_sparse_impl", lookups.embedding_lookup_sparse_impl),
        (variable_v1, "default_variable_creator", training.broadcasting_creator_v1),
        (variables, "default_variable_creator_v2", training.broadcasting_creator_v2),
        (optimizer_lib.Optimizer, "apply_gradients", training.averaging_apply_gradients),
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
