"""The exchange backends behind one protocol (:mod:`.base`), chosen by name from one registry.

================  ============================================================
``hb``            HybridBackend: dedup, alltoall ids, gather, alltoall vectors
``sok``           SparseOperationKit: allgather ids + alltoall partial sums for combined
                  lookups, alltoall for plain ones
``replicated``    data parallelism: whole tables everywhere, allgathered ids
                  and sparse gradients
================  ============================================================

A new exchange is one module with an :class:`~.base.Exchange` subclass and
its line in ``_MODULES``. This registry is the only place that refuses an
unknown backend name. It imports nothing (the exchange modules load on
first use), so ``collective.context`` can check ``COLLECTIVE_STRATEGY``
against it.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

# name -> (module, class)
_MODULES: Dict[str, Tuple[str, str]] = {
    "hb": ("collective.embedding.exchanges.hb", "HbExchange"),
    "sok": ("collective.embedding.exchanges.sok", "SokExchange"),
    "replicated": ("collective.embedding.exchanges.replicated", "ReplicatedExchange"),
}
_instances: Dict[str, Any] = {}


class UnknownBackendError(ValueError):
    """The requested exchange backend does not exist."""


def names() -> Tuple[str, ...]:
    """The registered backend names."""
    return tuple(_MODULES)


def check(name: str, described: str = "") -> str:
    """``name`` normalised (stripped, lower case) if registered, else :class:`UnknownBackendError`.

    ``described`` is how the message quotes the value (default ``backend 'name'``).
    """
    choice = str(name).strip().lower()
    if choice not in _MODULES:
        raise UnknownBackendError(f"{described or f'backend {name!r}'} is not one of {', '.join(_MODULES)}; "
                                  "pass one of those (CollectiveStrategy(backend=...) or COLLECTIVE_STRATEGY)")
    return choice


def get(name: str):
    """The exchange (an :class:`~.base.Exchange`) registered as ``name``."""
    choice = check(name)
    if choice not in _instances:
        module, cls = _MODULES[choice]
        _instances[choice] = getattr(importlib.import_module(module), cls)()
    return _instances[choice]
