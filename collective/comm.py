"""The collectives collective uses, as TensorFlow graph ops over Horovod.

Every function here works in graph mode (and in ``tf.function``), has a
gradient, and at world size 1 is an identity that does not need Horovod to be
initialised. Each call adds the bytes this worker sends to a per-graph
counter, :func:`bytes_counter`, that hooks and benchmarks read as bytes per
step, by the byte model of :mod:`collective.byte_model`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from collective import context
from collective.runtime import devices, hostmap
from collective.byte_model import sent_bytes

logger = logging.getLogger(__name__)

BYTES_COLLECTION = "collective_bytes_sent"
_eager_counter: Optional[tf.Variable] = None
_initialized = False
_host_group: List["HostGroup"] = []


def world_size() -> int:
    """Number of workers in the job."""
    return context.get().world_size


def rank() -> int:
    """This worker's rank."""
    return context.get().rank


def init() -> None:
    """Initialises Horovod once when the job has more than one worker."""
    global _initialized
    if _initialized or world_size() == 1:
        return
    import horovod.tensorflow as hvd

    hvd.init()
    if hvd.size() != world_size() or hvd.rank() != rank():
        raise RuntimeError(f"Horovod says rank {hvd.rank()} of {hvd.size()} but the environment says "
                           f"{rank()} of {world_size()}; start workers with python -m collective.launch")
    _initialized = True
    _pin_gpu(devices.LocalRank(hvd.local_rank(), hvd.local_size(), devices.HOROVOD))
    _make_host_group(hvd)


class HostGroup:
    """This worker's host in a job that crosses hosts hierarchically: the job's
    :class:`~collective.runtime.hostmap.HostMap` and the Horovod process set of this host's ranks (for
    :func:`alltoall`'s ``within_host``)."""

    def __init__(self, hosts: hostmap.HostMap, process_set):
        self.hosts = hosts
        self.process_set = process_set
        self.ranks = hosts.hosts[hosts.host_of(rank())]

    @property
    def local_rank(self) -> int:
        return self.ranks.index(rank())


def host_group() -> Optional[HostGroup]:
    """This worker's :class:`HostGroup` on a job that spans several hosts, else None (one host, a job not
    started with ``--hosts``, or ``COLLECTIVE_HIERARCHICAL=0``)."""
    init()
    return _host_group[0] if _host_group else None


def _make_host_group(hvd) -> None:
    """Adds one Horovod process set per host (every rank adds all of them, in host order) on a job that spans
    several hosts, for the exchanges to route through when the planner says it pays
    (``planner.hierarchical_pays``); refuses a host map Horovod does not agree with."""
    hosts = hostmap.from_env(world_size())
    if hosts is None or not hostmap.hierarchical_allowed() or len(hosts.hosts) < 2:
        return
    mine = hosts.hosts[hosts.host_of(rank())]
    if (hvd.local_rank(), hvd.local_size()) != (mine.index(rank()), len(mine)):
        raise RuntimeError(f"{hostmap.HOSTS_ENV}={os.environ.get(hostmap.HOSTS_ENV)} puts rank {rank()} at local rank "
                           f"{mine.index(rank())} of {len(mine)} but Horovod says {hvd.local_rank()} of "
                           f"{hvd.local_size()}; start the job with python -m collective.launch --hosts, or set "
                           f"{hostmap.HIERARCHICAL_ENV}=0")
    if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
        raise RuntimeError(f"a job on several hosts ({hostmap.HOSTS_ENV}) needs HOROVOD_DYNAMIC_PROCESS_SETS=1 for "
                           f"its hierarchical exchange (python -m collective.launch --hosts sets it), or set "
                           f"{hostmap.HIERARCHICAL_ENV}=0")
    sets = [hvd.add_process_set(list(ranks)) for ranks in hosts.hosts]
    _host_group.append(HostGroup(hosts, sets[hosts.host_of(rank())]))
    logger.info("hierarchical exchange: hosts %s, this host's ranks %s", list(hosts.hosts), list(mine))


def _pin_gpu(horovod: devices.LocalRank) -> None:
    """Takes Horovod's local rank (it counts the processes actually on this host) and pins this worker's GPU."""
    ctx = context.get()
    if (horovod.rank, horovod.size) != (ctx.local_rank, ctx.local_size):
        if ctx.local_source != devices.ASSUMED_ONE_HOST:
            logger.warning("Horovod says local rank %d of %d but %s says %d of %d; using Horovod's",
                           horovod.rank, horovod.size, ctx.local_source, ctx.local_rank, ctx.local_size)
        ctx = ctx.with_local_rank(horovod, devices.gpu_source())
        context.set(ctx)
    logger.debug("%s", ctx.placement.describe())
    devices.pin_tensorflow(ctx.placement)


def _hvd():
    init()
    import horovod.tensorflow as hvd

    return hvd


# ---------------------------------------------------------------- byte counter

def bytes_counter() -> tf.Variable:
    """The int64 variable counting the bytes this worker has sent.

    In a graph it is a local variable (initialised by the local initialiser,
    never checkpointed) kept in the collection ``collective_bytes_sent``; in
    eager mode it is one variable per process.
    """
    global _eager_counter
    with tf.init_scope():
        if tf.executing_eagerly():
            if _eager_counter is None:
                _eager_counter = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                             name="collective_bytes_sent")
            return _eager_counter
        graph = tf.compat.v1.get_default_graph()
        existing = graph.get_collection(BYTES_COLLECTION)
        if existing:
            return existing[0]
        with graph.name_scope(None):
            return tf.compat.v1.Variable(
                tf.constant(0, tf.int64), trainable=False, name="collective_bytes_sent", use_resource=True,
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES, BYTES_COLLECTION])


def graph_counters() -> list:
    """The byte counters of the default graph (none before its first counted collective, none in eager mode)."""
    if tf.executing_eagerly():
        return []
    return tf.compat.v1.get_collection(BYTES_COLLECTION)


def _unfoldable(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor`` behind an op Grappler's constant folding never evaluates.

    Horovod's ops are not marked stateful, so constant folding runs a
    collective whose inputs are constants (a static shape, literal splits)
    while the graph is optimised, on some ranks and not others, and the job
    deadlocks. A PlaceholderWithDefault is never folded.
    """
    if tf.executing_eagerly():
        return tensor
    return tf.compat.v1.placeholder_with_default(tensor, tensor.shape)


def rank_tensor() -> tf.Tensor:
    """This worker's rank as an int64 tensor that Grappler cannot fold.

    A literal rank makes graphs differ between ranks: on rank 0 the
    arithmetic optimiser simplifies ``0 * x``, and a collective feeding ``x``
    can then be scheduled differently there (seen as a hang in ``tf.function``).
    """
    return _unfoldable(tf.constant(rank(), tf.int64))


def _nbytes(tensor: tf.Tensor) -> tf.Tensor:
    return tf.size(tensor, out_type=tf.int64) * tensor.dtype.size


_uncounted_depth = 0


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Collectives built inside leave the byte counter alone: checkpoint saves and restores move tables,
    not training traffic, and would otherwise land in bytes/sample of the steps around them."""
    global _uncounted_depth
    _uncounted_depth += 1
    try:
        yield
    finally:
        _uncounted_depth -= 1


def _counted(outputs, sent_bytes: tf.Tensor):
    """Returns ``outputs`` (a tensor or tuple) after adding ``sent_bytes`` to the counter."""
    if _uncounted_depth:
        return outputs
    update = bytes_counter().assign_add(tf.cast(sent_bytes, tf.int64), read_value=False)
    with tf.control_dependencies([update]):
        if isinstance(outputs, tuple):
            return tuple(tf.identity(t) for t in outputs)
        return tf.identity(outputs)


def _grad_fn(grad):
    """Lets a ``tf.custom_gradient`` gradient ignore variables read inside the op (the byte counter)."""
    def wrapped(*dys, variables=None):
        grads = grad(*dys)
        return grads if variables is None else (grads, [None] * len(variables))

    return wrapped


# ---------------------------------------------------------------- collectives

def allreduce(tensor: tf.Tensor, op: str = "average", name: Optional[str] = None) -> tf.Tensor:
    """Sum or average of ``tensor`` over all workers (``op``: ``sum`` or ``average``)."""
    op = _check_op(op, ("sum", "average"))
    tensor = tf.convert_to_tensor(tensor)
    n = world_size()
    if n == 1:
        return tf.identity(tensor)

    @tf.custom_gradient
    def _allreduce(x):
        hvd = _hvd()
        y = hvd.allreduce(_unfoldable(x), op=hvd.Sum if op == "sum" else hvd.Average, name=name)
        return _counted(y, sent_bytes("allreduce", _nbytes(x), n)), _grad_fn(lambda dy: allreduce(dy, op))

    return _allreduce(tensor)


def grouped_allreduce(tensors: Sequence[tf.Tensor], op: str = "average") -> List[tf.Tensor]:
    """:func:`allreduce` of several tensors negotiated as one group."""
    op = _check_op(op, ("sum", "average"))
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    n = world_size()
    if n == 1 or not tensors:
        return [tf.identity(t) for t in tensors]

    @tf.custom_gradient
    def _grouped(*xs):
        hvd = _hvd()
        # Horovod groups tensors of one dtype: one group per dtype.
        ys = [None] * len(xs)
        by_dtype = {}
        for i, x in enumerate(xs):
            by_dtype.setdefault(x.dtype, []).append(i)
        for indices in by_dtype.values():
            reduced = hvd.grouped_allreduce([_unfoldable(xs[i]) for i in indices], op=hvd.Sum if op == "sum" else hvd.Average)
            for i, y in zip(indices, reduced):
                ys[i] = y
        sent = tf.add_n([sent_bytes("allreduce", _nbytes(x), n) for x in xs])
        return _counted(tuple(ys), sent), _grad_fn(lambda *dys: grouped_allreduce(list(dys), op))

    return list(_grouped(*tensors))


def allgather(tensor: tf.Tensor, name: Optional[str] = None) -> tf.Tensor:
    """Concatenates every worker's ``tensor`` along axis 0, in rank order; first dimensions may differ."""
    tensor = tf.convert_to_tensor(tensor)
    n = world_size()
    if n == 1:
        return tf.identity(tensor)

    @tf.custom_gradient
    def _allgather(x):
        hvd = _hvd()
        y = hvd.allgather(_unfoldable(x), name=name)
        rows = tf.shape(x, out_type=tf.int64)[:1]

        def grad(dy):
            # Each worker's rows were read by every worker: sum the gradient
            # over workers, then keep this worker's slice.
            counts = allgather(rows)
            start = tf.reduce_sum(counts[:rank()])
            return allreduce(dy, "sum")[start:start + rows[0]]

        return _counted(y, sent_bytes("allgather", _nbytes(x), n)), _grad_fn(grad)

    return _allgather(tensor)


def alltoall(tensor: tf.Tensor, splits: tf.Tensor, name: Optional[str] = None,
             within_host: bool = False) -> Tuple[tf.Tensor, tf.Tensor]:
    """Sends ``tensor[sum(splits[:j]):sum(splits[:j+1])]`` to worker ``j``.

    Returns the rows received, concatenated in rank order, and how many came
    from each worker (int32 ``[world_size]``). The gradient sends gradients
    back the way the rows came. ``within_host``: among this host's workers only
    (:func:`host_group`; ``j`` is a local rank).
    """
    tensor = tf.convert_to_tensor(tensor)
    splits = tf.cast(splits, tf.int32)
    n = world_size()
    if n == 1:
        return tf.identity(tensor), tf.reshape(tf.shape(tensor)[0], [1])

    @tf.custom_gradient
    def _alltoall(x):
        hvd = _hvd()
        if within_host:
            group = host_group()
            me, options = group.local_rank, {"process_set": group.process_set}
        else:
            me, options = rank(), {}
        y, received = hvd.alltoall(_unfoldable(x), splits=_unfoldable(splits), name=name, **options)
        row_bytes = _nbytes(x) // tf.maximum(tf.cast(tf.shape(x, out_type=tf.int64)[0], tf.int64), 1)
        sent_rows = tf.cast(tf.reduce_sum(splits) - splits[me], tf.int64)
        y, received = _counted((y, received), sent_rows * row_bytes)

        def grad(dy, _unused=None):
            return alltoall(dy, received, within_host=within_host)[0]

        return (y, received), _grad_fn(grad)

    y, received = _alltoall(tensor)
    return y, tf.stop_gradient(received)


def broadcast(tensor: tf.Tensor, root_rank: int = 0, name: Optional[str] = None, count: bool = True) -> tf.Tensor:
    """``tensor`` as it is on ``root_rank``, on every worker.

    ``count=False`` leaves the byte counter alone: variable initialisers
    broadcast before local variables, the counter among them, exist.
    """
    tensor = tf.convert_to_tensor(tensor)
    n = world_size()
    if n == 1:
        return tf.identity(tensor)
    hvd = _hvd()
    y = hvd.broadcast(_unfoldable(tensor), root_rank, name=name)
    if not count:
        return y
    # The same ops on every rank: Horovod names collectives after the graph's
    # op names, which rank-dependent construction would shift.
    sent = sent_bytes("broadcast", _nbytes(tensor), n) * int(rank() == root_rank)
    return _counted(y, sent)


def broadcast_string(value: Optional[str], root_rank: int = 0, max_bytes: int = 4096) -> str:
    """``value`` as it is on ``root_rank``, on every worker, from plain Python (eager or not).

    Runs in a graph and session of its own (made once per process), so it
    works whatever mode the caller is in; every worker must call it at the
    same point. Only ``value``'s bytes travel (``max_bytes`` bounds them).
    """
    if world_size() == 1:
        return value or ""
    data = (value or "").encode() if rank() == root_rank else b""
    if len(data) > max_bytes:
        raise ValueError(f"broadcast_string: {len(data)} bytes is more than max_bytes={max_bytes}")
    return bytes(_string_channel().gather(np.frombuffer(data, np.uint8))).decode()


class _StringChannel:
    """One graph and session per process that allgather uint8 vectors of any length.

    A broadcast is an allgather to which only the root gives bytes: one
    collective, the root's bytes only, and no graph or session made per call
    (the plan is agreed on before every session an Estimator makes).
    """

    def __init__(self):
        self._graph = tf.Graph()
        with self._graph.as_default():
            self._bytes = tf.compat.v1.placeholder(tf.uint8, [None], name="collective_string_bytes")
            self._gathered = _hvd().allgather(self._bytes, name="collective_broadcast_string")
        self._graph.finalize()
        self._session = tf.compat.v1.Session(graph=self._graph)
        self._lock = threading.Lock()

    def gather(self, data: np.ndarray) -> np.ndarray:
        with self._lock:
            return self._session.run(self._gathered, {self._bytes: data})


_channel: List[_StringChannel] = []


def _string_channel() -> _StringChannel:
    if not _channel:
        _channel.append(_StringChannel())
    return _channel[0]


def allreduce_max(tensor: tf.Tensor) -> tf.Tensor:
    """Element-wise maximum over workers (no gradient)."""
    tensor = tf.convert_to_tensor(tensor)
    if world_size() == 1:
        return tf.identity(tensor)
    hvd = _hvd()
    y = hvd.allreduce(_unfoldable(tf.stop_gradient(tensor)), op=hvd.Max)
    return _counted(y, sent_bytes("allreduce", _nbytes(tensor), world_size()))


def _check_op(op: str, choices: Tuple[str, ...]) -> str:
    if op not in choices:
        raise ValueError(f"reduction op {op!r} is not one of {', '.join(choices)}")
    return op
