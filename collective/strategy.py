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
from typing import Iterator, Optional

import tensorflow as tf

from collective import comm, context, modes, patches
from collective.embedding.table import ShardInfo, rows_on, shard_initial_value, tag
from collective.training import creating_shard


class UnknownBackendError(ValueError):
    """The requested exchange backend does not exist."""


class CollectiveStrategy:
    """Synchronous hybrid parallelism: data-parallel dense layers, sharded embedding tables.

    Args:
      backend: ``"hb"`` or ``"sok"``; default ``COLLECTIVE_STRATEGY``, else ``"hb"``.
    """

    def __init__(self, backend: Optional[str] = None):
        ctx = context.get()
        if backend is not None:
            choice = backend.strip().lower()
            if choice not in context.BACKENDS:
                raise UnknownBackendError(f"backend {backend!r} is not one of {', '.join(context.BACKENDS)}; "
                                          "pass one of those or set COLLECTIVE_STRATEGY")
            ctx = dataclasses.replace(ctx, backend=choice)
            context.set(ctx)
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
        with patches.patched():
            yield self

    @contextlib.contextmanager
    def embedding_scope(self, replicate_below_bytes: Optional[int] = None) -> Iterator[None]:
        """Model-parallel scope: 2-D variables created here become sharded tables.

        Args:
          replicate_below_bytes: tables smaller than this stay replicated on
            every worker (default ``COLLECTIVE_REPLICATE_BELOW_BYTES``, 0).
            Tables with fewer rows than workers always stay replicated.
        """
        threshold = self._context.replicate_below_bytes if replicate_below_bytes is None else replicate_below_bytes
        getter = _sharding_getter(self._context, threshold)
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), custom_getter=getter,
                                         auxiliary_name_scope=False):
            yield

    def estimator(self, model_fn, model_dir, config=None, params=None):
        """An Estimator that trains, evaluates, predicts and exports on every worker (see ``collective.estimator``)."""
        from collective.estimator import build_estimator  # pylint: disable=import-outside-toplevel

        return build_estimator(self, model_fn, model_dir, config=config, params=params)

    def export_saved_model(self, export_dir_base, checkpoint_path, signature_def_fn):
        """Rank 0 writes a SavedModel with whole tables that plain TensorFlow serves (see ``collective.export``)."""
        from collective.export import export_saved_model  # pylint: disable=import-outside-toplevel

        return export_saved_model(export_dir_base, checkpoint_path, signature_def_fn)

    def __repr__(self) -> str:
        return f"CollectiveStrategy(backend={self.backend!r}, rank={self.rank()}, world_size={self.world_size()})"


def _sharding_getter(ctx: context.Context, replicate_below_bytes: int):
    def sharding_getter(getter, name, shape=None, dtype=None, initializer=None, partitioner=None, **kwargs):
        dtype = tf.as_dtype(dtype or tf.float32)
        static = tf.TensorShape(shape) if shape is not None else tf.TensorShape(None)
        if (modes.is_exporting() or static.rank != 2 or not static.is_fully_defined() or static[0] < ctx.world_size
                or static.num_elements() * dtype.size < replicate_below_bytes):
            return getter(name, shape=shape, dtype=dtype, initializer=initializer, partitioner=partitioner,
                               **kwargs)
        vocab, dim = int(static[0]), int(static[1])
        info = ShardInfo(name=name, vocab=vocab, dim=dim, rank=ctx.rank, world_size=ctx.world_size)
        logical_init = initializer if initializer is not None else tf.compat.v1.glorot_uniform_initializer()

        def local_initializer(shape, dtype=dtype, partition_info=None):  # pylint: disable=unused-argument
            return shard_initial_value(logical_init, info, dtype)

        kwargs["use_resource"] = True
        with creating_shard(info):
            var = getter(name, shape=[rows_on(vocab, ctx.rank, ctx.world_size), dim], dtype=dtype,
                              initializer=local_initializer, partitioner=None, **kwargs)
        return tag(var, info)

    return sharding_getter
