"""Every change collective makes to TensorFlow, in one registry.

The module that owns a replacement registers it when it is imported
(:func:`register`); nothing here imports those modules, so the registry has
no dependency on them. ``collective.strategy`` imports every registering
module, so all of them are registered before :func:`patched` installs them.

While a :func:`patched` block is active (``CollectiveStrategy.scope()``),
the attributes below are replaced; leaving the block restores the originals
exactly. Nested blocks share one installation. Patches registered with
``on_demand=True`` are left alone by :func:`patched`: their owner installs
them for a block of its own with :func:`applied`.

``print(*patches.registered(), sep="\\n")`` lists them all:

========================================================  =====================================================
``embedding_ops.embedding_lookup`` (lookups)              lookups on sharded tables go through the exchange
``tf.compat.v1.nn.embedding_lookup`` (lookups)            the same, under its public v1 name
``embedding_ops.embedding_lookup_sparse_impl`` (lookups)  combined lookups (``embedding_lookup_sparse``, the
                                                          ``safe_`` variant, feature columns) likewise
``variable_v1.default_variable_creator`` (training)       dense variables start as rank 0's values
``variables.default_variable_creator_v2`` (training)      the same for ``tf.Variable``
``optimizer.Optimizer.compute_gradients`` (training)      gradients averaged over workers, as Horovod's
                                                          ``DistributedOptimizer``; slots of sharded tables
                                                          tagged as the table's rows when made
``optimizer.Optimizer.apply_gradients`` (training)        gradients not averaged yet (``tf.gradients``)
                                                          averaged once
Keras ``OptimizerV2`` and ``Optimizer`` ``apply_gradients``  the same for Keras optimizers of both generations
and ``compute_gradients`` (training)
``monitored_session.MonitoredTrainingSession`` (and the   every worker creates its session as a chief and saves
``tf.compat.v1.train`` name) (session)                    checkpoints with the others; rank 0 alone writes
                                                          summaries
``saver._get_saver_or_default`` (session)                 a default ``Scaffold`` saves whole logical tables
                                                          (``collective.checkpoint.Saver``)
``variables.global_variables_initializer`` (and the       also initialises the byte counter (a local
``tf.compat.v1`` names) (session)                         variable), so the global initializer alone suffices
``Estimator._call_model_fn`` (estimator)                  a plain ``tf.estimator.Estimator`` is refused when it
                                                          builds its model (``strategy.estimator`` instead), a
                                                          canned model_fn inside ``embedding_scope()`` too
``checkpoint_utils._init_from_checkpoint``,               ``init_from_checkpoint`` and ``warm_start_from``: a
``_set_checkpoint_initializer`` (warm_start)              sharded table loads its rows of the stored table
``tf.compat.v1.train.Saver`` (session)                    a user's Saver over sharded tables saves and restores
                                                          them as logical tables (``collective.checkpoint.Saver``)
``array_ops.zeros_like_impl``, ``ones_like_impl``          ``zeros_like(table)`` is known as made from the table
(training)                                                (a variable made from it is the table's rows)
``feature_column._internal_input_layer``                  ``input_layer``: sharded lookups of all columns in
(column_lookups)                                         one grouped exchange
``DenseFeatures.call`` (Keras, v1 and v2)                 the same for Keras ``DenseFeatures``
(column_lookups)
``_SharedEmbeddingColumn._get_dense_tensor_internal``     v1 shared columns accept their sharded table
(column_lookups)
``BatchNormalizationBase._support_zero_size_input``        Keras batch norm (v1 layers too): an empty batch of
(sync)                                                    uneven input leaves the moving statistics unchanged
                                                          and gives zero gradients instead of NaN
``estimator._verify_and_create_loss_metric``              on demand, in every ``CollectiveEstimator`` call:
(estimator)                                               the evaluation loss leaves out the empty batches of
                                                          padded input
``estimator._write_dict_to_summary``,                     on demand, on ranks other than 0: no evaluation
``estimator._write_checkpoint_path_to_summary``           summaries
(estimator)
========================================================  =====================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Dict, Iterator, List, NamedTuple, Tuple

_lock = threading.Lock()
_depth = 0
_registry: Dict[Tuple[object, str], "Patch"] = {}
_saved: Dict[Tuple[object, str], object] = {}
# On-demand patches applied now: TensorFlow's attribute and how many blocks apply it.
_applied: Dict[Tuple[object, str], Tuple[object, int]] = {}


@dataclasses.dataclass(frozen=True)
class Patch:
    """One registered replacement of ``owner.attribute`` (``owner`` a module or a class)."""

    owner: object
    attribute: str
    replacement: Callable
    why: str
    on_demand: bool = False


class Registration(NamedTuple):
    """A line of :func:`registered`: the owner's dotted name, the attribute and why it is replaced."""

    owner: str
    attribute: str
    why: str

    def __str__(self) -> str:
        return f"{self.owner}.{self.attribute}: {self.why}"


def _current(owner: object, name: str):
    """The attribute as stored on ``owner`` (a class's own entry, so static and class methods stay wrapped)."""
    return owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def _owner_name(owner: object) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return getattr(owner, "__name__", repr(owner))


def register(owner: object, attribute: str, replacement: Callable, why: str, *, on_demand: bool = False) -> Patch:
    """Registers ``replacement`` for ``owner.attribute``; returns the :class:`Patch`.

    Called at import time by the module defining ``replacement``. Without
    ``on_demand`` the patch is installed by :func:`patched` (at once if a
    block is active now); with it, only by :func:`applied`. Registering the
    same attribute again (a reloaded module) replaces the registration.
    """
    if not hasattr(owner, attribute):
        raise AttributeError(f"cannot patch {_owner_name(owner)}.{attribute}: TensorFlow has no such attribute")
    patch = Patch(owner, attribute, replacement, why, on_demand)
    key = (owner, attribute)
    with _lock:
        previous = _registry.get(key)
        if previous is not None and previous.on_demand != on_demand:
            raise ValueError(f"{_owner_name(owner)}.{attribute} is already registered "
                             f"{'on demand' if previous.on_demand else 'for patched()'}")
        _registry[key] = patch
        if not on_demand and _depth > 0:
            if key not in _saved:
                _saved[key] = _current(owner, attribute)
            setattr(owner, attribute, replacement)
    return patch


def registration(owner: object, attribute: str) -> Patch:
    """The :class:`Patch` registered for ``owner.attribute`` (``KeyError`` naming it if none is)."""
    with _lock:
        patch = _registry.get((owner, attribute))
    if patch is None:
        raise KeyError(f"no patch of {_owner_name(owner)}.{attribute} is registered; import "
                       "collective.integration.replacements first")
    return patch


def registered() -> List[Registration]:
    """Every registered patch as ``(owner name, attribute, why)``, in registration order."""
    with _lock:
        return [Registration(_owner_name(p.owner), p.attribute, p.why) for p in _registry.values()]


def original(owner: object, name: str):
    """The attribute as TensorFlow defines it, whether or not it is patched now."""
    key = (owner, name)
    if key in _applied:
        return _applied[key][0]
    return _saved.get(key, _current(owner, name))


def active() -> bool:
    """Whether collective's patches are installed."""
    return _depth > 0


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Installs the patches for the duration of the block."""
    global _depth
    with _lock:
        if _depth == 0:
            for (owner, name), patch in _registry.items():
                if patch.on_demand:
                    continue
                _saved[(owner, name)] = _current(owner, name)
                setattr(owner, name, patch.replacement)
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
                                        "apply_gradients", "compute_gradients", "_compute_gradients")
              ) -> Iterator[None]:
    """TensorFlow's originals of the patched attributes ``names`` for the block (default: creators, optimizer).

    Export builds its graph with the variable creators and optimizer
    restored (no broadcast of initial values enters a SavedModel) while the
    lookups stay routed (hash-table export variables need them).
    """
    with _lock:
        keys = [key for key in _saved if key[1] in names]
        replaced = {key: _current(*key) for key in keys}
        for owner, name in keys:
            setattr(owner, name, _saved[(owner, name)])
    try:
        yield
    finally:
        with _lock:
            for (owner, name), value in replaced.items():
                setattr(owner, name, value)


@contextlib.contextmanager
def applied(*patches: Patch) -> Iterator[None]:
    """Installs the on-demand ``patches`` for the block; leaving it restores what each replaced.

    Blocks nest: an inner block restores the outer block's replacement.
    """
    for patch in patches:
        if not patch.on_demand:
            raise ValueError(f"{_owner_name(patch.owner)}.{patch.attribute} is installed by patched(), "
                             "not on demand")
    replaced: List[Tuple[Patch, object]] = []
    with _lock:
        for patch in patches:
            key = (patch.owner, patch.attribute)
            value = _current(*key)
            tf_value, count = _applied.get(key, (value, 0))
            _applied[key] = (tf_value, count + 1)
            replaced.append((patch, value))
            setattr(patch.owner, patch.attribute, patch.replacement)
    try:
        yield
    finally:
        with _lock:
            for patch, value in reversed(replaced):
                key = (patch.owner, patch.attribute)
                setattr(patch.owner, patch.attribute, value)
                tf_value, count = _applied[key]
                if count == 1:
                    del _applied[key]
                else:
                    _applied[key] = (tf_value, count - 1)
