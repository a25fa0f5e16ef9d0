"""Creating a hash-table vocabulary: this worker's values variable, tagged as a table, and its index.

The values variable ``[capacity_per_worker, dim]`` (``[None, dim]`` for a table
growing from ``initial_capacity_per_worker``, :mod:`.growth`) is the local shard, tagged
with a :class:`~collective.embedding.table.ShardInfo` whose ``hash_index``
is this worker's :class:`~collective.embedding.hash_table.index.HashTable`.
It is trained like any sharded table (gradients arrive as ``IndexedSlices``;
optimizer slots are sharded the same way).
"""

from __future__ import annotations

from typing import Iterable, Optional

import tensorflow as tf

from collective import comm
from collective.embedding import modes
from collective.embedding.hash_table.export import export_variable
from collective.embedding.hash_table.growth import Growth, hidden
from collective.embedding.hash_table.index import DEFAULT_LOAD_FACTOR, HashTable
from collective.embedding.hash_table.local_variables import eager_variable, full_name, plain_variable
from collective.embedding.hash_table.policy import VocabularyPolicy, policy_from
from collective.embedding.table import ShardInfo, shard_of, tag
from collective.sharding import shards
from collective.sharding.plan import PlanError
from collective.sharding.planner import TableSpec
from collective.embedding.tables import creating_shard

HASH_TABLES_COLLECTION = "collective_hash_tables"
"""Graph collection of every :class:`HashTable` built in the graph."""


def table_of(var) -> Optional[HashTable]:
    """The :class:`HashTable` behind a hash-table values variable (or one of its slots), else None."""
    info = shard_of(var)
    return info.hash_index if info is not None else None


def _find_existing(name: str) -> Optional[HashTable]:
    for table in tf.compat.v1.get_collection(HASH_TABLES_COLLECTION):
        if table.name == name:
            return table
    return None


def hash_embedding_variable(name: str, dim: int, capacity_per_worker: int, initializer=None,
                            dtype=tf.float32, key_dtype=tf.int64, trainable: bool = True,
                            load_factor: float = DEFAULT_LOAD_FACTOR,
                            collections: Optional[Iterable[str]] = None,
                            policy: Optional[VocabularyPolicy] = None,
                            initial_capacity_per_worker: Optional[int] = None, api: str = "scope",
                            **policy_keywords) -> tf.Variable:
    """A sharded embedding table with a hash-table vocabulary: keys of any int64 value.

    Inside ``CollectiveStrategy.scope()``, ``tf.nn.embedding_lookup`` and
    ``tf.nn.embedding_lookup_sparse`` on the returned variable exchange keys
    with their owners (``floormod(key, N)``), which map them to rows, adding
    unseen keys in training (see :func:`~collective.embedding.hash_table.inference`).

    Args:
      name: variable name, in the current variable scope (reused when it exists).
      dim: embedding dimension.
      capacity_per_worker: most keys one worker holds (SOK's
        ``max_vocabulary_size_per_gpu``, ``DynamicVariable(max_capacity=)``);
        a batch that would exceed it fails with an error naming the table,
        unless a policy evicts.
      initializer: a new key's first vector (see :mod:`collective.embedding.key_init`
        for the supported initialisers; default uniform in [-0.05, 0.05] as SOK).
      dtype: dtype of the values.
      key_dtype: ``tf.int64`` or ``tf.int32`` (keys are looked up as int64 either way).
      trainable: whether optimizers train it.
      load_factor: fraction of the index's probe slots that may be filled.
      collections: collections of the values variable (default global variables).
      policy: a :class:`~collective.embedding.hash_table.policy.VocabularyPolicy`
        (admission, eviction, the full-table rule), or its fields as keyword
        arguments: ``min_count``, ``counter_capacity``, ``counter_steps_to_live``,
        ``default_value``, ``steps_to_live``, ``l2_weight_threshold``,
        ``evict_every_steps``, ``evict_at_checkpoint``, ``evict_strategy`` (``"lru"``/``"lfu"``),
        ``max_fill``, ``fill_after_evict``. Without one every key seen in
        training gets a row and a full table fails.
      initial_capacity_per_worker: rows allocated at first, when below
        ``capacity_per_worker`` (SOK's ``DynamicVariable(init_capacity=)``):
        the table then grows, doubling its index's slots, up to
        ``capacity_per_worker`` (:mod:`.growth`; graph mode and
        ``tf.compat.v1.train`` optimizers only). Default: allocated at
        ``capacity_per_worker``.
      api: the face making it, for the sharding plan: ``"scope"``, or ``"sok"`` for SOK's own tables
        (``sok.DynamicVariable``, SOK's hash-table layers), which are row-wise only.

    Placed ``table_wise`` by the strategy's ``sharding=`` (docs/sharding.md), the whole table (its index and
    its slots with it) sits on one rank, with room for the keys of all workers
    (``capacity_per_worker * N``); the other ranks hold ``[0, dim]`` and every key is routed to that rank.

    Returns:
      The values variable ``[capacity_per_worker, dim]`` (``[None, dim]`` when it grows), tagged as a shard
      whose ``ShardInfo.hash_index`` is this worker's :class:`HashTable`. In
      export mode (``collective.embedding.modes.exporting``) a plain ``[rows, dim]``
      variable with a ``tf.lookup`` key -> row table instead (see
      :func:`~collective.embedding.hash_table.exported`).
    """
    if tf.as_dtype(key_dtype) not in (tf.int64, tf.int32):
        raise TypeError(f"hash table '{name}': key_dtype must be tf.int64 or tf.int32, got {key_dtype!r}; "
                        "hash string keys to int64 first (collective.hash_embedding_column does)")
    if int(capacity_per_worker) < 1:
        raise ValueError(f"hash table '{name}': capacity_per_worker must be >= 1, got {capacity_per_worker!r}")
    initial = _initial_capacity(full_name(name), capacity_per_worker, initial_capacity_per_worker)
    policy = policy_from(full_name(name), policy, policy_keywords)
    if policy is not None:
        policy.check(full_name(name), dim)
    if modes.is_exporting():
        return export_variable(name, dim, dtype, policy.default_row(dim) if policy is not None else None)
    if tf.executing_eagerly():
        if policy is not None or initial is not None:
            raise NotImplementedError(f"hash table '{name}': vocabulary policies (admission, eviction) and growth "
                                      "(initial_capacity_per_worker) work in graph mode (tf.compat.v1 graphs) only")
        return _eager_hash_embedding_variable(name, dim, capacity_per_worker, initializer, dtype, trainable,
                                              load_factor, api)
    table_name = full_name(name)
    existing = _find_existing(table_name)
    if existing is not None:
        return existing.values
    collections = list(collections or [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    info = shards.place(_spec(table_name, capacity_per_worker, dim, dtype, api))
    _check_table_wise(info, policy, initial)
    capacity = shards.hash_capacity(info, capacity_per_worker)
    plan = Growth(table_name, int(capacity_per_worker), initial, load_factor) if initial is not None else None
    with creating_shard(info):
        if plan is None or len(plan.slots) == 1:
            values = plain_variable(name, [capacity, int(dim)], tf.as_dtype(dtype),
                                    tf.compat.v1.zeros_initializer(), collections, trainable=trainable)
        else:
            rows, dtype = plan.sizes[0], tf.as_dtype(dtype)
            values = plain_variable(name, [None, int(dim)], dtype,
                                    lambda: tf.zeros([hidden(rows), int(dim)], dtype), collections, trainable=trainable)
        table = HashTable(values.op.name, dim, capacity, initializer, dtype, load_factor,
                          index_scope=name + "/hash_index", policy=policy, initial_capacity=initial,
                          initializer_rows=int(capacity_per_worker))
    table.values = values
    table.grows_with_index(values)
    tf.compat.v1.add_to_collection(HASH_TABLES_COLLECTION, table)
    return tag(values, shards.renamed(info, values.op.name, hash_index=table))


def _spec(table: str, capacity_per_worker: int, dim: int, dtype, api: str) -> TableSpec:
    """The planner's view of a hash table: its capacity over all workers."""
    return TableSpec(table, int(capacity_per_worker) * comm.world_size(), int(dim), tf.as_dtype(dtype).name,
                     key_space="hash", api=api)


def _check_table_wise(info: ShardInfo, policy: Optional[VocabularyPolicy], initial: Optional[int]) -> None:
    """Refuses, before any variable is made, what a table-wise hash table does not have yet."""
    if info.holder is None:
        return
    if policy is not None or initial is not None:
        what = "a vocabulary policy (admission, eviction)" if policy is not None else \
            "growth (initial_capacity_per_worker)"
        raise PlanError(f"hash table {info.name!r}: placement 'table_wise' is not built for a table with {what} "
                        "yet; place it row_wise (the default for hash tables) or drop that option")


def _initial_capacity(table: str, capacity: int, initial: Optional[int]) -> Optional[int]:
    """``initial_capacity_per_worker`` checked against the capacity; None when the table does not grow."""
    if initial is None:
        return None
    if not 1 <= int(initial) <= int(capacity):
        raise ValueError(f"hash table '{table}': initial_capacity_per_worker={initial!r} must be between 1 and "
                         f"capacity_per_worker={capacity}")
    return int(initial) if int(initial) < int(capacity) else None


def _eager_hash_embedding_variable(name: str, dim: int, capacity_per_worker: int, initializer, dtype,
                                   trainable: bool, load_factor: float, api: str) -> tf.Variable:
    """:func:`hash_embedding_variable` in eager code: plain ``tf.Variable`` objects, no graph collections.

    The caller tracks them (a Keras layer adds the values as a trainable
    weight and ``table_of(values).variables`` as non-trainable ones), so
    ``tf.train.Checkpoint`` and ``model.save_weights`` keep this worker's table.
    """
    values = eager_variable(name, [int(capacity_per_worker), int(dim)], tf.as_dtype(dtype),
                            tf.compat.v1.zeros_initializer(), trainable=trainable)
    table_name = values.name.split(":")[0]  # the name scope's, known once made
    info = shards.place(_spec(table_name, capacity_per_worker, dim, dtype, api))
    capacity = shards.hash_capacity(info, capacity_per_worker)
    if capacity != int(capacity_per_worker):  # table-wise: made again at the holder's rows (0 elsewhere)
        values = eager_variable(name, [capacity, int(dim)], tf.as_dtype(dtype), tf.compat.v1.zeros_initializer(),
                                trainable=trainable)
    table = HashTable(table_name, dim, capacity, initializer, dtype, load_factor, index_scope=name + "/hash_index",
                      initializer_rows=int(capacity_per_worker))
    table.values = values
    return tag(values, shards.renamed(info, table_name, hash_index=table))
