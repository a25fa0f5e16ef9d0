"""DeepRec's ``categorical_column_with_embedding`` over collective's hash-table vocabularies.

    import collective.hash_embedding_column as cfc

    movie = cfc.categorical_column_with_embedding("movie_id", dtype=tf.int64)
    column = tf.feature_column.embedding_column(movie, dimension=16,
                                                initializer=tf.random_uniform_initializer(-1e-3, 1e-3))
    with strategy.embedding_scope():
        emb = tf.compat.v1.feature_column.input_layer(features, [column])

The column passes keys through (int keys as they are, string keys hashed to
int64) and makes ``embedding_column`` create a hash-table embedding variable
(:func:`collective.embedding.hash_table.hash_embedding_variable`) instead of
a ``[num_buckets, dim]`` one: keys are exchanged with their owners
(``floormod(key, N)``), which hand out rows on first sight.
"""

from __future__ import annotations

import collections
import logging
from typing import Optional

import tensorflow as tf

from collective import context
from collective.embedding import modes
from collective.embedding import hash_table
from collective.tf_internals import feature_column_v1 as fc_old
from collective.tf_internals import feature_column_v2 as fc
from collective.tf_internals import patches

log = logging.getLogger(__name__)

DEFAULT_CAPACITY_PER_WORKER = 1 << 17
"""Keys one worker holds per column unless ``EmbeddingVariableOption(capacity_per_worker=...)`` says otherwise."""
STRING_KEY_BUCKETS = 2 ** 63 - 1
"""String keys become ``tf.strings.to_hash_bucket_fast(key, STRING_KEY_BUCKETS)``: FarmHash64 into [0, 2**63 - 1)."""
_WEIGHTS = "embedding_weights"


class InitializerOption:
    """DeepRec's ``tf.InitializerOption``: an initializer for the column's vectors.

    ``default_value_no_permission`` is what keys without a row read (not
    admitted yet by a ``filter_option``, or evicted), in training lookups,
    ``inference()`` and the exported model. ``default_value_dim`` is accepted
    and ignored: every key's first vector is drawn from ``initializer`` as a
    function of the key (:mod:`collective.embedding.key_init`).
    """

    def __init__(self, initializer=None, default_value_dim: int = 4096, default_value_no_permission: float = 0.0):
        self.initializer = initializer
        self.default_value_dim = default_value_dim
        self.default_value_no_permission = default_value_no_permission


class CounterFilter:
    """DeepRec's ``tf.CounterFilter``: a key gets a row once training lookups saw it ``filter_freq`` times.

    Exact counts kept by the key's owner (``VocabularyPolicy.min_count``).
    """

    def __init__(self, filter_freq: int = 0):
        self.filter_freq = int(filter_freq)


class CBFFilter(CounterFilter):
    """DeepRec's ``tf.CBFFilter`` (counting Bloom filter), served by the exact counter of :class:`CounterFilter`.

    A counting Bloom filter's false positives depend on which keys share its
    cells, and so on how keys are spread over workers: its admissions could
    not be the same on every N. Collective therefore counts exactly (no false
    positives; ``false_positive_probability``, ``max_element_size`` and
    ``counter_type`` are accepted and ignored) and bounds the counter table
    by ``EmbeddingVariableOption(counter_capacity=...)`` instead.
    """

    def __init__(self, filter_freq: int = 0, max_element_size: int = 0, false_positive_probability: float = -1.0,
                 counter_type=tf.uint64):
        super().__init__(filter_freq)
        del max_element_size, false_positive_probability, counter_type


class GlobalStepEvict:
    """DeepRec's ``tf.GlobalStepEvict``: drop keys no training lookup saw for more than ``steps_to_live`` steps."""

    def __init__(self, steps_to_live: Optional[int] = None):
        self.steps_to_live = steps_to_live


class L2WeightEvict:
    """DeepRec's ``tf.L2WeightEvict``: drop keys whose vector's L2 norm is below ``l2_weight_threshold``."""

    def __init__(self, l2_weight_threshold: float = -1.0):
        self.l2_weight_threshold = l2_weight_threshold


class EmbeddingVariableOption:
    """DeepRec's ``tf.EmbeddingVariableOption``, with the options collective has.

    Args:
      capacity_per_worker: keys one worker may hold (default
        :data:`DEFAULT_CAPACITY_PER_WORKER`); a training batch that would
        exceed it fails naming the table (unless a policy evicts).
      initial_capacity_per_worker: rows allocated at first; below
        ``capacity_per_worker`` the table grows up to it (DeepRec's
        EmbeddingVariable grows without bound; here it is bounded by
        ``capacity_per_worker``). Default: allocated at ``capacity_per_worker``.
      load_factor: fraction of the index's probe slots that may be filled.
      init_option: an :class:`InitializerOption`; its initializer replaces
        ``embedding_column``'s, its ``default_value_no_permission`` is what
        keys without a row read.
      ht_type, ht_partition_num: accepted and ignored (one hash table kind;
        sharding is collective's).
      filter_option: :class:`CounterFilter` or :class:`CBFFilter` (feature admission).
      evict_option: :class:`GlobalStepEvict` or :class:`L2WeightEvict` (feature eviction).
      storage_option: multi-tier storage is not supported; anything but None raises.
      evict_every_steps, evict_at_checkpoint, counter_capacity, evict_strategy:
        collective's :class:`~collective.embedding.hash_table.VocabularyPolicy`
        options. With an ``evict_option`` and neither ``evict_every_steps``
        nor ``evict_at_checkpoint``, eviction runs when a checkpoint is saved
        and only then, as in DeepRec; ``evict_every_steps`` alone runs it at
        that interval instead.
    """

    def __init__(self, capacity_per_worker: Optional[int] = None, load_factor: float = hash_table.DEFAULT_LOAD_FACTOR,
                 init_option: Optional[InitializerOption] = None, ht_type=None, ht_partition_num=None,
                 evict_option=None, filter_option=None, storage_option=None, evict_every_steps: Optional[int] = None,
                 counter_capacity: Optional[int] = None, evict_strategy: Optional[str] = None,
                 evict_at_checkpoint: Optional[bool] = None,
                 initial_capacity_per_worker: Optional[int] = None):
        if storage_option is not None:
            raise NotImplementedError("EmbeddingVariableOption(storage_option=...) is not supported by collective's "
                                      "hash tables; leave it None")
        del ht_type, ht_partition_num
        self.capacity_per_worker = capacity_per_worker
        self.initial_capacity_per_worker = initial_capacity_per_worker
        self.load_factor = load_factor
        self.init_option = init_option
        self.policy = _policy_of(init_option, filter_option, evict_option, evict_every_steps, counter_capacity,
                                 evict_strategy, evict_at_checkpoint)


def _policy_of(init_option, filter_option, evict_option, evict_every_steps, counter_capacity,
               evict_strategy, evict_at_checkpoint=None) -> Optional[hash_table.VocabularyPolicy]:
    """The :class:`VocabularyPolicy` DeepRec's options describe (None: every key admitted, none evicted)."""
    options = {}
    if filter_option is not None:
        if not isinstance(filter_option, CounterFilter):
            raise TypeError(f"EmbeddingVariableOption(filter_option={filter_option!r}): give CounterFilter(...) or "
                            "CBFFilter(...) from collective.hash_embedding_column")
        options["min_count"] = max(1, filter_option.filter_freq)
    if evict_option is not None:
        if isinstance(evict_option, GlobalStepEvict):
            if evict_option.steps_to_live is not None:
                options["steps_to_live"] = int(evict_option.steps_to_live)
        elif isinstance(evict_option, L2WeightEvict):
            if evict_option.l2_weight_threshold > 0:
                options["l2_weight_threshold"] = float(evict_option.l2_weight_threshold)
        else:
            raise TypeError(f"EmbeddingVariableOption(evict_option={evict_option!r}): give GlobalStepEvict(...) or "
                            "L2WeightEvict(...) from collective.hash_embedding_column")
    for name, value in (("evict_every_steps", evict_every_steps), ("counter_capacity", counter_capacity),
                        ("evict_strategy", evict_strategy), ("evict_at_checkpoint", evict_at_checkpoint)):
        if value is not None:
            options[name] = value
    evicts = "steps_to_live" in options or "l2_weight_threshold" in options
    if evicts and evict_every_steps is None and evict_at_checkpoint is None:
        # DeepRec evicts when it saves a checkpoint, and only then.
        options.update(evict_at_checkpoint=True, evict_every_steps=None)
    default = getattr(init_option, "default_value_no_permission", 0.0)
    if default:
        options["default_value"] = default
    return hash_table.VocabularyPolicy(**options) if options else None


def categorical_column_with_embedding(key: str, dtype=tf.int64, partition_num=None,
                                      ev_option: Optional[EmbeddingVariableOption] = None):
    """A categorical column over an unbounded key space, embedded through a sharded hash table.

    DeepRec's signature (its default dtype is ``tf.string``; ours is
    ``tf.int64``). Use it with ``tf.feature_column.embedding_column`` and
    ``tf.compat.v1.feature_column.input_layer`` inside
    ``CollectiveStrategy.scope()`` (and ``embedding_scope()``).

    Args:
      key: the feature's name.
      dtype: ``tf.int64``/``tf.int32`` (keys used as they are) or ``tf.string``
        (hashed with :data:`STRING_KEY_BUCKETS`).
      partition_num: ignored; tables are sharded over the workers by
        ``floormod(key, N)``, as is a ``fixed_size_partitioner`` around it.
      ev_option: an :class:`EmbeddingVariableOption` (capacity, initializer).

    As with every TensorFlow categorical column, negative integer keys count
    as missing: ``-1`` in dense input is dropped, and ``embedding_column``'s
    safe lookup drops negative ids.
    """
    dtype = tf.as_dtype(dtype)
    if not (dtype.is_integer or dtype == tf.string):
        raise ValueError(f"categorical_column_with_embedding('{key}'): dtype must be an integer type or tf.string, "
                         f"got {dtype.name}")
    if partition_num is not None:
        log.info("categorical_column_with_embedding('%s'): partition_num=%s ignored; the table is sharded over the "
                 "workers", key, partition_num)
    option = ev_option or EmbeddingVariableOption()
    capacity = option.capacity_per_worker or DEFAULT_CAPACITY_PER_WORKER
    init_option = getattr(option, "init_option", None)
    initializer = getattr(init_option, "initializer", None)
    return HashEmbeddingCategoricalColumn(key, dtype, int(capacity), float(getattr(option, "load_factor", 0.5)),
                                          initializer, getattr(option, "policy", None),
                                          getattr(option, "initial_capacity_per_worker", None))


class HashEmbeddingCategoricalColumn(
        fc.CategoricalColumn, fc_old._CategoricalColumn,  # pylint: disable=protected-access
        collections.namedtuple("HashEmbeddingCategoricalColumn",
                               ("key", "dtype", "capacity_per_worker", "load_factor", "initializer", "policy",
                                "initial_capacity_per_worker"))):
    """See :func:`categorical_column_with_embedding`."""

    @property
    def _is_v2_column(self):
        return True

    @property
    def name(self):
        return self.key

    @property
    def parse_example_spec(self):
        return {self.key: tf.io.VarLenFeature(self.dtype)}

    @property
    def _parse_example_spec(self):
        return self.parse_example_spec

    @property
    def num_buckets(self):
        """The logical capacity (per-worker capacity times workers); keys are not bounded by it."""
        return self.capacity_per_worker * context.get().world_size

    @property
    def _num_buckets(self):
        return self.num_buckets

    @property
    def parents(self):
        return [self.key]

    def _keys(self, value) -> tf.SparseTensor:
        sparse = fc._to_sparse_input_and_drop_ignore_values(value)  # pylint: disable=protected-access
        if sparse.dtype == tf.string:
            if self.dtype != tf.string:
                raise ValueError(f"column '{self.key}' has dtype {self.dtype.name} but its input holds strings; "
                                 "pass dtype=tf.string to categorical_column_with_embedding")
            keys = tf.strings.to_hash_bucket_fast(sparse.values, STRING_KEY_BUCKETS)
        elif sparse.dtype.is_integer:
            if not self.dtype.is_integer:
                raise ValueError(f"column '{self.key}' has dtype {self.dtype.name} but its input holds "
                                 f"{sparse.dtype.name}; pass an integer dtype to categorical_column_with_embedding")
            keys = tf.cast(sparse.values, tf.int64)
        else:
            raise ValueError(f"column '{self.key}' takes integer or string keys, got {sparse.dtype.name}")
        return tf.SparseTensor(sparse.indices, keys, sparse.dense_shape)

    def transform_feature(self, transformation_cache, state_manager):
        return self._keys(transformation_cache.get(self.key, state_manager))

    def _transform_feature(self, inputs):
        return self._keys(inputs.get(self.key))

    def get_sparse_tensors(self, transformation_cache, state_manager):
        raise ValueError(f"column '{self.key}' (categorical_column_with_embedding) works with "
                         "tf.compat.v1.feature_column.input_layer; Keras DenseFeatures would create a plain "
                         "[num_buckets, dim] table for it")

    def _get_sparse_tensors(self, inputs, weight_collections=None, trainable=None):
        del weight_collections, trainable
        keys = inputs.get(self)
        scope = tf.compat.v1.get_variable_scope()
        table_name = f"{scope.name}/{_WEIGHTS}" if scope.name else _WEIGHTS
        if modes.is_exporting():
            keys = _export_rows(keys, table_name)
        elif not patches.active():
            raise ValueError(f"column '{self.key}' (categorical_column_with_embedding) must be built inside "
                             "CollectiveStrategy.scope(): its lookups exchange keys between workers")
        _create_table_on_next_get(scope, table_name, self)
        return fc.CategoricalColumn.IdWeightPair(keys, None)

    def get_config(self):
        return {"key": self.key, "dtype": self.dtype.name, "capacity_per_worker": self.capacity_per_worker,
                "load_factor": self.load_factor, "initializer": None,
                "initial_capacity_per_worker": self.initial_capacity_per_worker}

    @classmethod
    def from_config(cls, config, custom_objects=None, columns_by_name=None):
        del custom_objects, columns_by_name
        return cls(config["key"], tf.as_dtype(config["dtype"]), config["capacity_per_worker"],
                   config["load_factor"], None, None, config.get("initial_capacity_per_worker"))


def _export_rows(keys: tf.SparseTensor, table_name: str) -> tf.SparseTensor:
    """Export mode: keys mapped to rows of the padded plain table (negative keys dropped, as in training)."""
    keys = tf.sparse.retain(keys, keys.values >= 0)
    index = hash_table.export_index(_WEIGHTS, table_name)
    table = hash_table.ExportedTable(table_name, None, index, modes.export_rows(table_name))
    return tf.SparseTensor(keys.indices, table.rows_of(keys.values), keys.dense_shape)


def _create_table_on_next_get(scope, table_name: str, column: HashEmbeddingCategoricalColumn) -> None:
    """Makes ``embedding_column``'s next ``get_variable('embedding_weights')`` in ``scope`` build the hash table.

    ``embedding_column`` asks for the column's sparse ids and then, in the
    same variable scope, for a ``[num_buckets, dim]`` variable: a one-shot
    custom getter on that scope answers with the hash table instead (its
    values variable, or in export mode the padded plain table).
    """
    previous = scope.custom_getter
    if getattr(previous, "collective_hash_table", None) == table_name:
        return

    def hash_table_getter(getter, name, *args, **kwargs):
        if name != table_name:
            return previous(getter, name, *args, **kwargs) if previous else getter(name, *args, **kwargs)
        scope.set_custom_getter(previous)
        shape = tf.TensorShape(kwargs.get("shape"))
        dtype = kwargs.get("dtype") or tf.float32
        if modes.is_exporting():
            default = column.policy.default_row(int(shape[-1])) if column.policy is not None else None
            values = hash_table.export_variable(_WEIGHTS, int(shape[-1]), dtype, default)
            return hash_table.exported(values).padded()
        initializer = column.initializer if column.initializer is not None else kwargs.get("initializer")
        return hash_table.hash_embedding_variable(
            _WEIGHTS, int(shape[-1]), column.capacity_per_worker, initializer=initializer, dtype=dtype,
            trainable=kwargs.get("trainable", True) is not False, load_factor=column.load_factor,
            collections=kwargs.get("collections"), policy=column.policy,
            initial_capacity_per_worker=column.initial_capacity_per_worker)

    hash_table_getter.collective_hash_table = table_name
    scope.set_custom_getter(hash_table_getter)
