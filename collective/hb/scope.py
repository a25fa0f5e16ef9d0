"""``hb.scope()`` and ``hb.embedding_scope()``: CollectiveStrategy with the ``hb`` exchange."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from collective.strategy import CollectiveStrategy

_strategy: Optional[CollectiveStrategy] = None


def strategy() -> CollectiveStrategy:
    """The process's ``CollectiveStrategy(backend="hb")``, created on first use."""
    global _strategy
    if _strategy is None:
        _strategy = CollectiveStrategy(backend="hb")
    return _strategy


@contextlib.contextmanager
def scope(**kwargs) -> Iterator[CollectiveStrategy]:
    """Data-parallel scope (HybridBackend's ``hb.scope()``): build the model and its lookups inside it.

    HybridBackend's keyword options (``emb_device``, ``emb_dtype``, ...) are
    not supported; passing one raises a ``TypeError`` that names it.
    """
    if kwargs:
        raise TypeError(f"hb.scope() got unsupported option(s) {', '.join(sorted(kwargs))}; "
                        "collective.hb.scope() takes no options (set COLLECTIVE_* environment variables instead)")
    with strategy().scope() as s:
        yield s


@contextlib.contextmanager
def embedding_scope(replicate_below_bytes: Optional[int] = None, **kwargs) -> Iterator[None]:
    """Model-parallel scope (``hb.embedding_scope()``): 2-D variables created here are sharded by rows.

    It also enters :func:`scope` (nesting is free), so lookups built inside it
    go through the exchange; lookups built after it need an enclosing
    :func:`scope`. ``replicate_below_bytes`` keeps smaller tables replicated.
    """
    if kwargs:
        raise TypeError(f"hb.embedding_scope() got unsupported option(s) {', '.join(sorted(kwargs))}; "
                        "the only option is replicate_below_bytes")
    with scope(), strategy().embedding_scope(replicate_below_bytes):
        yield
