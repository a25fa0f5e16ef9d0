"""``hb.train``: optimizer wrappers, ``Server``, ``device_setter`` and ``MonitoredTrainingSession``.

Every ``tf.compat.v1.train`` optimizer has a wrapper of the same name here
(``hb.train.AdamOptimizer``...), and :func:`wraps_optimizer` makes one of a
user's class. A wrapped optimizer trains synchronously inside or outside
``hb.scope()``, exactly as :mod:`collective.integration.training` makes every optimizer
inside the scope: ``compute_gradients`` averages, ``apply_gradients``
averages what is not averaged yet, and no gradient is averaged twice.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import List, Optional

import tensorflow as tf

from collective import comm, context
from collective.integration import packed, training
from collective.embedding import hash_table, packed_tables, tables
from collective.embedding.table import shard_of
from collective.tf_internals import optimizer_lib, patches

logger = logging.getLogger("collective.hb")

# tf.compat.v1.train optimizers that get no wrapper, and why.
_NOT_WRAPPED = {
    "Optimizer": "it is the abstract base class; decorate your subclass with hb.train.wraps_optimizer",
    "SyncReplicasOptimizer": "it aggregates through parameter servers; every hb.train optimizer is already "
                             "synchronous over all workers",
}


def _inherited(cls: type, name: str):
    """The ``name`` method ``cls`` inherits, TensorFlow's own where it comes from the base ``Optimizer``."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return patches.original(klass, name) if klass is optimizer_lib.Optimizer else klass.__dict__[name]
    raise TypeError(f"{cls.__name__} has no {name}; wraps_optimizer needs a tf.compat.v1.train.Optimizer")


def wraps_optimizer(cls: type) -> type:
    """Makes a synchronous version of the ``tf.compat.v1.train.Optimizer`` subclass ``cls``.

    Usable as a class decorator (``@hb.train.wraps_optimizer``). The returned
    class has the same name, constructor and behaviour except that
    ``compute_gradients`` (hence ``minimize``) returns gradients averaged
    over workers, as Horovod's ``DistributedOptimizer``, and
    ``apply_gradients`` averages those not averaged yet (from ``tf.gradients``),
    inside or outside ``hb.scope()``, each gradient once
    (:mod:`collective.integration.training`). Slots of sharded tables are the tables'
    rows wherever the optimizer was built (:mod:`collective.embedding.tables`).
    """
    if not (isinstance(cls, type) and issubclass(cls, optimizer_lib.Optimizer)):
        raise TypeError(f"hb.train.wraps_optimizer needs a subclass of tf.compat.v1.train.Optimizer, got {cls!r}; "
                        "Keras optimizers are averaged inside hb.scope() without a wrapper")
    if getattr(cls, "_collective_wrapped", False):
        return cls
    compute, apply = _inherited(cls, "compute_gradients"), _inherited(cls, "apply_gradients")
    slot_of = _inherited(cls, "get_slot")

    def compute_gradients(self, *args, **kwargs):
        comm.init()
        return training.averaged_compute(self, functools.partial(compute, self), *args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        comm.init()
        return training.averaged_apply(self, functools.partial(apply, self), grads_and_vars,
                                       global_step=global_step, name=name)

    def get_slot(self, var, *args, **kwargs):
        return packed.get_slot(self, functools.partial(slot_of, self), var, *args, **kwargs)

    compute_gradients.__doc__ = f"{cls.__name__}.compute_gradients, averaged over workers."
    get_slot.__doc__ = f"{cls.__name__}.get_slot; of a packed table, its rows of its group's slot."
    apply_gradients.__doc__ = (f"{cls.__name__}.apply_gradients; gradients not averaged yet are averaged over "
                               "workers first.")
    namespace = {"compute_gradients": compute_gradients, "apply_gradients": apply_gradients, "get_slot": get_slot,
                 "_collective_wrapped": True,
                 "__doc__": f"Synchronous {cls.__name__} over all workers (see hb.train.wraps_optimizer).\n\n"
                            + (inspect.getdoc(cls) or ""),
                 "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    return type(cls.__name__, (cls,), namespace)


def _generate_wrappers() -> List[str]:
    names = []
    for name, value in vars(tf.compat.v1.train).items():
        if (name in _NOT_WRAPPED or not isinstance(value, type)
                or not issubclass(value, optimizer_lib.Optimizer)):
            continue
        wrapped = wraps_optimizer(value)
        wrapped.__module__ = __name__
        globals()[name] = wrapped
        names.append(name)
    return sorted(names)


OPTIMIZERS = _generate_wrappers()


def __getattr__(name: str):
    if name in _NOT_WRAPPED:
        raise AttributeError(f"hb.train.{name} is not provided: {_NOT_WRAPPED[name]}. "
                             f"Available optimizers: {', '.join(OPTIMIZERS)}")
    raise AttributeError(f"module 'collective.hb.train' has no attribute {name!r}")


class Server:
    """HybridBackend's ``hb.train.Server``: the in-process target every worker's session uses.

    Workers talk through Horovod, not through TensorFlow's gRPC servers, so
    ``target`` is ``""`` (an in-process session). The cluster comes from the
    launcher's environment (:mod:`collective.context`); ``server_def`` and
    similar arguments of ``tf.distribute.Server`` are refused by name.
    """

    def __init__(self, **kwargs):
        if kwargs:
            raise TypeError(f"hb.train.Server() got unsupported argument(s) {', '.join(sorted(kwargs))}; it reads "
                            "the cluster from the environment set by python -m collective.launch")
        comm.init()
        self.target = ""

    def join(self) -> None:
        """Parameter servers wait here in HybridBackend; collective has none, so this returns at once."""


def device_setter() -> str:
    """The device this worker's graph goes on: its own GPU, or ``/cpu:0``.

    The GPU is chosen by local rank whatever started the workers (our launcher, ``horovodrun``,
    ``mpirun``, ``srun``; :mod:`collective.runtime.devices`) and the session is pinned to it:
    ``hb.train.MonitoredTrainingSession`` and ``hb.estimator.Estimator`` set
    ``gpu_options.visible_device_list`` to it, so in the session it is named ``/gpu:0`` on every
    worker (on local rank 1 of a host with four visible GPUs, ``/gpu:0`` is the second GPU). A
    session made by hand needs ``hb.strategy().session_config()``.
    """
    comm.init()  # Horovod's local rank, where no launcher variable gave one
    return context.get().device


def _same_on_every_worker(var) -> bool:
    """Dense variables and whole-table copies; not shards, nor a hash table's per-worker key index, nor a packing
    group's variable or slots (this worker's rows of its tables)."""
    info = shard_of(var)
    return ((info is None or info.replicated) and tables.slot_owner(var) is None
            and not hash_table.is_index_state(var) and not packed_tables.is_packed(var))


class _BroadcastDenseVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Sets every replicated global variable to rank 0's value once the session exists.

    Models built outside ``hb.scope()`` (as HybridBackend's recipes are)
    create dense variables with each worker's own random initial values.
    Sharded tables and each worker's own hash-table index (keys, rows,
    size) are left alone: after a restore they hold that worker's keys.
    """

    def begin(self):
        variables = [v for v in tf.compat.v1.global_variables() if _same_on_every_worker(v)]
        self._op = tf.group(*[v.assign(comm.broadcast(v.read_value(), 0, count=False)) for v in variables]) \
            if variables else tf.no_op()

    def after_create_session(self, session, coord):
        session.run(self._op)


def MonitoredTrainingSession(master: str = "", is_chief: bool = True, checkpoint_dir: Optional[str] = None,  # noqa: N802
                             hooks=None, **kwargs):
    """HybridBackend's ``hb.train.MonitoredTrainingSession`` (the arguments of TensorFlow's).

    Every worker passes ``is_chief=True`` (each initialises its own shards).
    Dense variables start as rank 0's; checkpoints, when ``checkpoint_dir``
    is given, go through :func:`collective.integration.session.MonitoredTrainingSession`
    (whole logical tables, restorable on any number of workers).
    """
    comm.init()
    hooks = list(hooks or [])
    if comm.world_size() > 1:
        hooks.append(_BroadcastDenseVariablesHook())
    try:
        from collective.integration.session import MonitoredTrainingSession as session_fn  # pylint: disable=import-outside-toplevel
    except ImportError:
        logger.warning("collective.integration.session is not available: checkpoints use TensorFlow's own saver")
        session_fn = tf.compat.v1.train.MonitoredTrainingSession
    from collective.hb.scope import scope  # pylint: disable=import-outside-toplevel

    # Inside the scope the session's default saver is collective's (whole logical tables, all workers).
    with scope():
        return session_fn(master=master, is_chief=is_chief, checkpoint_dir=checkpoint_dir, hooks=hooks, **kwargs)
