"""CollectiveStrategy: the one object a training script needs.

    strategy = CollectiveStrategy()            # backend from COLLECTIVE_STRATEGY, else hb
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("table", [vocab, dim])   # sharded across workers
        emb = tf.nn.embedding_lookup(table, ids)                       # exchanged ids and vectors
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Iterator, Optional

import tensorflow as tf

from collective import comm, context, modes
# lookups, session, column_lookups, sync and training register their patches when imported: patched() installs them.
from collective import column_lookups, lookups, session, sync  # noqa: F401  pylint: disable=unused-import
from collective.embedding import exchanges
from collective.embedding import lookup as embedding_lookup
from collective.embedding.exchanges import UnknownBackendError
from collective.embedding.table import ShardInfo, shard_initial_value, tag
from collective.tf_internals import patches
from collective.training import creating_shard


class CollectiveStrategy:
    """Synchronous hybrid parallelism: data-parallel dense layers, sharded embedding tables.

    Args:
      backend: a registered exchange (``"hb"``, ``"sok"``, ``"replicated"``; see
        :mod:`collective.embedding.exchanges`); default ``COLLECTIVE_STRATEGY``, else ``"hb"``.
        The strategy owns it: lookups built inside its ``scope()`` use it, other
        strategies in the same process keep theirs.
    """

    def __init__(self, backend: Optional[str] = None):
        ctx = context.get()
        if backend is not None:
            ctx = dataclasses.replace(ctx, backend=exchanges.check(backend))
        self._context = ctx

    @property
    def backend(self) -> str:
        return self._context.backend

    def world_size(self) -> int:
        """Number of workers."""
        return self._context.world_size

    def rank(self) -> int:
        """This worker's rank."""
        return self._context.rank

    @contextlib.contextmanager
    def scope(self) -> Iterator["CollectiveStrategy"]:
        """Data-parallel scope: build the whole model inside it. Leaving it restores TensorFlow."""
        comm.init()
        with patches.patched(), embedding_lookup.using(self.backend):
            yield self

    @contextlib.contextmanager
    def embedding_scope(self, replicate_below_bytes: Optional[int] = None) -> Iterator[None]:
        """Model-parallel scope: 2-D variables created here become sharded tables.

        Args:
          replicate_below_bytes: tables smaller than this stay replicated on
            every worker (default ``COLLECTIVE_REPLICATE_BELOW_BYTES``, 0).
            Tables with fewer rows than workers always stay replicated.

        Under the ``replicated`` backend, and for tables under the threshold,
        every worker holds the whole table (served by the ``replicated``
        exchange); tables with fewer rows than workers, and everything made
        while exporting, are ordinary variables.
        """
        threshold = self._context.replicate_below_bytes if replicate_below_bytes is None else replicate_below_bytes
        getter = _sharding_getter(self._context, threshold)
        # Keras layers (``DenseFeatures``, ``add_weight``) make variables without
        # get_variable: a variable creator shards those.
        with _custom_getter(getter), tf.compat.v1.variable_creator_scope(_sharding_creator(self._context, threshold)):
            yield

    def session_config(self, base: Optional[tf.compat.v1.ConfigProto] = None) -> tf.compat.v1.ConfigProto:
        """A session config pinned to this worker's GPU by its local rank, whatever started the workers.

        ``base`` is copied (default: ``allow_soft_placement=True``) and its
        ``gpu_options.visible_device_list`` set to this worker's GPU, the usual
        Horovod step; the session's ``/gpu:0`` is then that GPU. Sessions the
        library makes (``MonitoredTrainingSession``, the Estimator) use it; pass it
        to sessions you make yourself. See :mod:`collective.devices`.
        """
        comm.init()  # Horovod's local rank, where no launcher variable gave one
        return context.session_config(base)

    def device(self) -> str:
        """The device this worker's graph goes on in a session made with :meth:`session_config`."""
        comm.init()
        return context.get().device

    def estimator(self, model_fn, model_dir, config=None, params=None, *, shard_input: bool = False,
                  throughput_every_n_steps: Optional[int] = None):
        """An Estimator that trains, evaluates, predicts and exports on every worker (see ``collective.estimator``).

        ``shard_input=True`` keeps every N-th batch of what ``input_fn`` returns on each worker;
        ``throughput_every_n_steps`` is the interval of the default throughput hook
        (:class:`collective.estimator.CollectiveEstimator`).
        """
        from collective.estimator import build_estimator  # pylint: disable=import-outside-toplevel

        return build_estimator(self, model_fn, model_dir, config=config, params=params, shard_input=shard_input,
                               throughput_every_n_steps=throughput_every_n_steps)

    def export_saved_model(self, export_dir_base, checkpoint_path, signature_def_fn):
        """Rank 0 writes a SavedModel with whole tables that plain TensorFlow serves (see ``collective.export``)."""
        from collective.export import export_saved_model  # pylint: disable=import-outside-toplevel

        return export_saved_model(export_dir_base, checkpoint_path, signature_def_fn)

    def __repr__(self) -> str:
        return f"CollectiveStrategy(backend={self.backend!r}, rank={self.rank()}, world_size={self.world_size()})"


@contextlib.contextmanager
def _custom_getter(custom_getter) -> Iterator[None]:
    """Adds ``custom_getter`` to the current variable scope for the block.

    Re-entering the scope with ``variable_scope(..., custom_getter=...)``
    would reset the numbering of its sub-scopes on exit (a second
    ``input_layer`` would be named ``input_layer`` again): variables keep
    the names plain TensorFlow gives them only if no scope is opened.
    """
    scope = tf.compat.v1.get_variable_scope()
    previous = scope.custom_getter

    def composed(getter, *args, **kwargs):
        inner = getter if previous is None else functools.partial(previous, getter)
        return custom_getter(inner, *args, **kwargs)

    scope.set_custom_getter(composed)
    try:
        yield
    finally:
        scope.set_custom_getter(previous)


_getter_state = threading.local()


@contextlib.contextmanager
def _inside_getter() -> Iterator[None]:
    """Marks variables made through the sharding getter: it has already decided on them."""
    previous = getattr(_getter_state, "active", False)
    _getter_state.active = True
    try:
        yield
    finally:
        _getter_state.active = previous


def _table_info(ctx: context.Context, name: str, static: tf.TensorShape, dtype: tf.DType,
                replicate_below_bytes: int) -> Optional[ShardInfo]:
    """How a variable of shape ``static`` made in ``embedding_scope()`` is held; None for an ordinary variable.

    Whole on every worker (the ``replicated`` layout) under the ``replicated``
    backend and below ``replicate_below_bytes``; sharded by rows otherwise.
    """
    if modes.is_exporting() or static.rank != 2 or not static.is_fully_defined() or static[0] < ctx.world_size:
        return None
    replicated = ctx.backend == "replicated" or static.num_elements() * dtype.size < replicate_below_bytes
    return ShardInfo(name=name, vocab=int(static[0]), dim=int(static[1]), rank=ctx.rank, world_size=ctx.world_size,
                     replicated=replicated)


def _sharding_creator(ctx: context.Context, replicate_below_bytes: int):
    """A variable creator that shards the 2-D trainable variables Keras makes (``add_weight``)."""

    def sharding_creator(next_creator, **kwargs):
        initial_value = kwargs.get("initial_value")
        shape = kwargs.get("shape")
        if shape is None and isinstance(initial_value, functools.partial) and len(initial_value.args) >= 1:
            shape = initial_value.args[0]
        if (getattr(_getter_state, "active", False) or kwargs.get("trainable") is False
                or initial_value is None or kwargs.get("variable_def") is not None):
            return next_creator(**kwargs)
        if shape is None and not callable(initial_value):
            initial_value = tf.convert_to_tensor(initial_value, dtype=kwargs.get("dtype"))
            shape = initial_value.shape  # tf.Variable(<a whole table>): a pretrained table
        dtype = tf.as_dtype(kwargs.get("dtype") or getattr(initial_value, "dtype", None) or tf.float32).base_dtype
        static = tf.TensorShape(shape) if shape is not None else tf.TensorShape(None)
        info = _table_info(ctx, kwargs.get("name") or "embedding", static, dtype, replicate_below_bytes)
        if info is None:
            return next_creator(**kwargs)
        local_value = _local_initial_value(initial_value, info, dtype)
        kwargs = dict(kwargs, initial_value=local_value, shape=tf.TensorShape([info.local_rows, info.dim]),
                      dtype=dtype)
        with creating_shard(info):
            var = next_creator(**kwargs)
        name = kwargs.get("name") if tf.executing_eagerly() else var.op.name
        return tag(var, dataclasses.replace(info, name=name or info.name))

    return sharding_creator


def _local_initial_value(initial_value, info: ShardInfo, dtype: tf.DType):
    """A callable giving this worker's rows of a Keras-style logical initial value."""
    if isinstance(initial_value, functools.partial) and initial_value.func is not None and \
            tuple(initial_value.args[:1]) and list(tf.TensorShape(initial_value.args[0])) == list(info.logical_shape):
        return lambda: shard_initial_value(initial_value.func, info, dtype)

    def rows_of_full_value():
        full = initial_value() if callable(initial_value) else initial_value
        return info.layout.local_part(tf.convert_to_tensor(full, dtype=dtype))

    return rows_of_full_value


def _sharding_getter(ctx: context.Context, replicate_below_bytes: int):
    def sharding_getter(getter, name, shape=None, dtype=None, initializer=None, partitioner=None, **kwargs):
        with _inside_getter():
            return _get_sharded(getter, name, shape, dtype, initializer, partitioner, kwargs)

    def _get_sharded(getter, name, shape, dtype, initializer, partitioner, kwargs):
        if kwargs.get("trainable") is False:  # optimizer slots (laid out as their table already), step counters
            return getter(name, shape=shape, dtype=dtype, initializer=initializer, partitioner=partitioner,
                          **kwargs)
        if shape is None and initializer is not None and not callable(initializer):
            return _get_from_value(getter, name, dtype, initializer, partitioner, kwargs)
        dtype = tf.as_dtype(dtype or tf.float32)
        static = tf.TensorShape(shape) if shape is not None else tf.TensorShape(None)
        info = _table_info(ctx, name, static, dtype, replicate_below_bytes)
        if info is None:
            return getter(name, shape=shape, dtype=dtype, initializer=initializer, partitioner=partitioner,
                               **kwargs)
        logical_init = initializer if initializer is not None else tf.compat.v1.glorot_uniform_initializer()

        def local_initializer(shape, dtype=dtype, partition_info=None):  # pylint: disable=unused-argument
            return shard_initial_value(logical_init, info, dtype)

        kwargs["use_resource"] = True
        with creating_shard(info):
            var = getter(name, shape=[info.local_rows, info.dim], dtype=dtype,
                              initializer=local_initializer, partitioner=None, **kwargs)
        return tag(var, info)

    def _get_from_value(getter, name, dtype, initializer, partitioner, kwargs):
        """``get_variable(name, initializer=<a whole table as a tensor or array>)``: a pretrained table."""
        value = tf.convert_to_tensor(initializer, dtype=dtype)
        info = _table_info(ctx, name, value.shape, value.dtype.base_dtype, replicate_below_bytes)
        if info is None:
            return getter(name, shape=None, dtype=dtype, initializer=initializer, partitioner=partitioner, **kwargs)
        kwargs["use_resource"] = True
        with creating_shard(info):
            var = getter(name, shape=None, dtype=dtype, initializer=info.layout.local_part(value), partitioner=None,
                         **kwargs)
        return tag(var, info)

    return sharding_getter
