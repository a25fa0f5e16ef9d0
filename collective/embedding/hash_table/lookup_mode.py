"""Whether hash-table lookups built now insert unseen keys (training) or read zeros for them (inference)."""

from __future__ import annotations

import contextlib
import threading
from typing import ContextManager, Iterator

_state = threading.local()


def is_training() -> bool:
    """Whether hash-table lookups built now insert unseen keys (False inside :func:`inference`)."""
    return getattr(_state, "training", True)


@contextlib.contextmanager
def inference() -> Iterator[None]:
    """Lookups built inside the block do not insert unseen keys; those get zero vectors.

    Build evaluation and prediction graphs inside it (DeepRec's
    EmbeddingVariable does the same: inference never grows the table).
    """
    previous = is_training()
    _state.training = False
    try:
        yield
    finally:
        _state.training = previous


def for_mode(mode: str) -> ContextManager[None]:
    """The lookup mode of an Estimator ``mode``: :func:`inference` for ``eval``/``infer``, else training.

    ``with hash_table.for_mode(mode): spec = model_fn(features, labels, mode, ...)``
    """
    return inference() if mode in ("eval", "infer") else contextlib.nullcontext()
