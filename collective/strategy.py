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

from collective.sharding import runtime as sharding_runtime
from collective.sharding.plan import ShardingPlan
from collective.sharding.planner import Overrides

import tensorflow as tf

from collective import comm, context
from collective.embedding import exchanges, tables
from collective.embedding import lookup as embedding_lookup
from collective.embedding.exchanges import UnknownBackendError
# The one list of what scope() installs into TensorFlow (patches.patched()).
from collective.integration import replacements  # noqa: F401  pylint: disable=unused-import
from collective.tf_internals import patches


class CollectiveStrategy:
    """Synchronous hybrid parallelism: data-parallel dense layers, sharded embedding tables.

    Args:
      backend: a registered exchange (``"hb"``, ``"sok"``, ``"replicated"``; see
        :mod:`collective.embedding.exchanges`); default ``COLLECTIVE_STRATEGY``, else ``"hb"``.
        The strategy owns it: lookups built inside its ``scope()`` use it, other
        strategies in the same process keep theirs.
      sharding: placements chosen by the user (docs/sharding.md): a dict of table name (as the model names
        it) -> ``"row_wise"`` / ``"replicated"`` / ..., a callable from a table's default
        :class:`~collective.sharding.plan.TablePlan` to a placement (or None: the default), or a
        :class:`~collective.sharding.plan.ShardingPlan`. Default: the plan ``COLLECTIVE_SHARDING`` names,
        else the planner's defaults. An override that cannot hold is refused, naming the table.
      memory_per_worker: bytes each worker has for tables; a placement that needs more is refused.
    """

    def __init__(self, backend: Optional[str] = None, sharding: Overrides = None,
                 memory_per_worker: Optional[int] = None):
        ctx = context.get()
        if backend is not None:
            ctx = dataclasses.replace(ctx, backend=exchanges.check(backend))
        self._context = ctx
        self._planning = sharding_runtime.Planning(ctx, sharding, memory_per_worker)
        self._own_overrides = sharding is not None or memory_per_worker is not None

    @property
    def plan(self) -> ShardingPlan:
        """The sharding plan of the tables made in this strategy's scopes so far (``print`` shows the table)."""
        return self._planning.plan

    def announce_plan(self) -> ShardingPlan:
        """Checks the plan whole, agrees on it with every worker and logs it on rank 0 (sessions and Estimators
        made by collective do this before step 0; call it before the first step of a loop of your own)."""
        return sharding_runtime.announce(self._planning)

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
        with patches.patched(), embedding_lookup.using(self.backend), sharding_runtime.using(self._planning):
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
        # A strategy made without overrides inside another's scope (a model_fn's own
        # ``CollectiveStrategy().embedding_scope()``) places its tables in the enclosing plan.
        planning = (None if self._own_overrides else sharding_runtime.enclosing()) or self._planning
        # Keras layers (``DenseFeatures``, ``add_weight``) make variables without
        # get_variable: a variable creator shards those.
        with tables.custom_getter(tables.sharding_getter(self._context, threshold)), \
                tf.compat.v1.variable_creator_scope(tables.sharding_creator(self._context, threshold)), \
                tables.embedding_scope_block(), sharding_runtime.using(planning):
            yield

    def session_config(self, base: Optional[tf.compat.v1.ConfigProto] = None) -> tf.compat.v1.ConfigProto:
        """A session config pinned to this worker's GPU by its local rank, whatever started the workers.

        ``base`` is copied (default: ``allow_soft_placement=True``) and its
        ``gpu_options.visible_device_list`` set to this worker's GPU, the usual
        Horovod step; the session's ``/gpu:0`` is then that GPU. Sessions the
        library makes (``MonitoredTrainingSession``, the Estimator) use it; pass it
        to sessions you make yourself. See :mod:`collective.runtime.devices`.
        """
        comm.init()  # Horovod's local rank, where no launcher variable gave one
        return context.session_config(base)

    def device(self) -> str:
        """The device this worker's graph goes on in a session made with :meth:`session_config`."""
        comm.init()
        return context.get().device

    def estimator(self, model_fn, model_dir, config=None, params=None, *, shard_input: bool = False,
                  throughput_every_n_steps: Optional[int] = None, incremental_save_steps: Optional[int] = None,
                  incremental_save_secs: Optional[float] = None, warm_start_from=None):
        """An Estimator that trains, evaluates, predicts and exports on every worker (see ``collective.integration.estimator``).

        ``shard_input=True`` keeps every N-th batch of what ``input_fn`` returns on each worker;
        ``throughput_every_n_steps`` is the interval of the default throughput hook;
        ``incremental_save_steps`` or ``incremental_save_secs`` add incremental checkpoints (deltas)
        between the full ones (:class:`collective.integration.estimator.CollectiveEstimator`);
        ``warm_start_from`` is ``tf.estimator.Estimator``'s: sharded tables load their rows of the stored tables.
        """
        from collective.integration.estimator import build_estimator  # pylint: disable=import-outside-toplevel

        return build_estimator(self, model_fn, model_dir, config=config, params=params, shard_input=shard_input,
                               throughput_every_n_steps=throughput_every_n_steps,
                               incremental_save_steps=incremental_save_steps,
                               incremental_save_secs=incremental_save_secs, warm_start_from=warm_start_from)

    def export_saved_model(self, export_dir_base, checkpoint_path, signature_def_fn):
        """Rank 0 writes a SavedModel with whole tables that plain TensorFlow serves (see ``collective.integration.export``)."""
        from collective.integration.export import export_saved_model  # pylint: disable=import-outside-toplevel

        return export_saved_model(export_dir_base, checkpoint_path, signature_def_fn)

    def __repr__(self) -> str:
        return f"CollectiveStrategy(backend={self.backend!r}, rank={self.rank()}, world_size={self.world_size()})"
