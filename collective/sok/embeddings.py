"""``sok.DistributedEmbedding`` and ``sok.All2AllDenseEmbedding``: Keras layers over sharded tables.

Each layer owns one logical table of ``max_vocabulary_size_per_gpu *
world_size`` rows; worker ``r`` holds the rows ``key % world_size == r`` as
its embedding variable of ``max_vocabulary_size_per_gpu`` rows. Lookups go
through :mod:`collective.embedding.lookup` and the ``sok`` exchange:

- ``DistributedEmbedding`` (SOK's combiner lookup): allgather of (key,
  sample) rows, each rank sums the rows it holds per sample, alltoall of
  the partial sums back to the rank that asked (the ``sok`` exchange),
  eagerly, in ``tf.function`` and in TF1 graphs.
- ``All2AllDenseEmbedding``: bucket keys by owner, alltoall, gather, alltoall back.

``use_hashtable=True`` (SOK's default) gives a hash-table vocabulary
(:mod:`collective.embedding.hash_table`, any int64 key, rows handed out on
first sight, a key's first vector drawn from the initializer seeded by the
key); eagerly, in ``tf.function`` and in TF1 graphs. ``call(..., training=False)``
looks keys up without inserting them (unseen keys read zeros). ``use_hashtable=False`` indexes rows by
key, so keys must lie in ``[0, max_vocabulary_size_per_gpu * world_size)``.

As in SOK, ``layer.embedding_variable`` exists before the first call (reading
it builds the table), and it carries SOK's ``m_var_name``:
``EmbeddingVariable``, ``EmbeddingVariable_1``, ... in order of layer
construction (per graph in TF1), the name :class:`collective.sok.Saver`'s
files take. ``tf.train.Checkpoint`` and ``model.save_weights`` save the
embedding variable as its whole logical table (:mod:`collective.sok.checkpoint`).
"""

from __future__ import annotations

import contextlib

from typing import Optional

import tensorflow as tf

from collective import comm, context
from collective.embedding import lookup as sharded
from collective.embedding.table import ShardInfo, shard_initial_value, tag
from collective.sharding import shards
from collective.sharding.planner import TableSpec
from collective.sok.checkpoint import not_saved, save_logical
from collective.sok.init import refuse_tf_distribute

COMBINERS = ("mean", "sum")
_DEFAULT_INITIALIZER = "random_uniform"
_SOK_VARIABLE_NAME = "EmbeddingVariable"


def _sok_variable_name() -> str:
    """SOK v1's ``m_var_name`` for the next embedding variable: unique in the (outermost) default graph."""
    with tf.init_scope():
        graph = tf.compat.v1.get_default_graph()
        with graph.name_scope(None):
            return graph.unique_name(_SOK_VARIABLE_NAME, mark_as_used=True)


def _positive(layer: str, name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{layer}: {name}={value!r} must be a positive integer")
    return value


def _initializer(layer: str, value):
    if value is None or value == _DEFAULT_INITIALIZER:
        return tf.keras.initializers.RandomUniform(minval=-0.05, maxval=0.05)
    try:
        return tf.keras.initializers.get(value)
    except ValueError as err:
        raise ValueError(f"{layer}: embedding_initializer={value!r} is not a Keras initializer name or "
                         "instance; use e.g. 'random_uniform' or tf.keras.initializers.Constant(...)") from err


class _ShardedEmbedding(tf.keras.layers.Layer):
    """The table both SOK layers share: creation, initial values and the ``key % N`` layout."""

    def __init__(self, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, slot_num: int,
                 use_hashtable: bool, key_dtype, embedding_initializer, **kwargs):
        kind = type(self).__name__
        refuse_tf_distribute(f"sok.{kind}")
        # The table's dtype is Keras' floatx unless given: a TF1 Keras layer would otherwise take the dtype of
        # its first input, the int64 keys.
        kwargs.setdefault("dtype", tf.keras.backend.floatx())
        super().__init__(**kwargs)
        comm.init()
        self.max_vocabulary_size_per_gpu = _positive(kind, "max_vocabulary_size_per_gpu",
                                                     max_vocabulary_size_per_gpu)
        self.embedding_vec_size = _positive(kind, "embedding_vec_size", embedding_vec_size)
        self.slot_num = _positive(kind, "slot_num", slot_num)
        self.use_hashtable = bool(use_hashtable)
        self.key_dtype = tf.as_dtype(key_dtype)
        if self.key_dtype not in (tf.int64, tf.int32):
            raise ValueError(f"{kind}: key_dtype={key_dtype!r} must be tf.int64 or tf.int32")
        self.initializer = _initializer(kind, embedding_initializer)
        self.info: Optional[ShardInfo] = None
        self.m_var_name = _sok_variable_name()

    def __getattr__(self, name):
        # SOK creates the embedding variable with the layer (programs load values into it before any call);
        # here build() creates it, so reading it first builds the table.
        state = self.__dict__
        # Not while build() runs: Keras' __setattr__ reads the attribute as build() sets it.
        if name == "embedding_variable" and "m_var_name" in state and not state.get("built") \
                and not state.get("_building_table"):
            self._build_table()
            return state["embedding_variable"]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _build_table(self) -> None:
        """Builds the layer outside a call, in the name scope a call would use (eagerly: under ``init_scope``)."""
        if tf.compat.v1.executing_eagerly_outside_functions():
            with tf.init_scope(), tf.name_scope(self.name):
                self.build(None)
        else:
            with tf.compat.v1.name_scope(self.name):
                self.build(None)

    def build(self, input_shape):
        self.__dict__["_building_table"] = True
        try:
            self._build_shard(input_shape)
        finally:
            self.__dict__["_building_table"] = False

    def _build_shard(self, input_shape):
        ctx = context.get()
        vocab = self.max_vocabulary_size_per_gpu * ctx.world_size
        if self.use_hashtable:
            from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

            if tf.executing_eagerly():  # TF2: Keras builds under init_scope, also inside tf.function
                var = hash_table.hash_embedding_variable("embedding_variables", self.embedding_vec_size,
                                                         self.max_vocabulary_size_per_gpu, self.initializer,
                                                         dtype=self.dtype, key_dtype=self.key_dtype, api="sok")
            else:
                # Named in the current name scope, as eagerly (and as Keras names the layer's other weights), so
                # that a table trained eagerly and the graph built for its export carry one name.
                scope = tf.compat.v1.VariableScope(None, name=tf.compat.v1.get_default_graph().get_name_scope())
                with tf.compat.v1.variable_scope(scope, auxiliary_name_scope=False):
                    var = hash_table.hash_embedding_variable("embedding_variables", self.embedding_vec_size,
                                                             self.max_vocabulary_size_per_gpu, self.initializer,
                                                             dtype=self.dtype, key_dtype=self.key_dtype, api="sok")
            self._trainable_weights.append(var)
            index = hash_table.table_of(var)
            if isinstance(index, hash_table.HashTable):  # not in an export graph, where it is a lookup table
                save_logical(var)
                # Non-trainable weights that checkpoints do not track: the table's checkpoint holds its keys,
                # and a restore rebuilds the index from them.
                state = [not_saved(v) for v in index.variables]
                self._non_trainable_weights.extend(state)
                self.__dict__.update(hash_keys=state[0], hash_rows=state[1], hash_size=state[2])
        else:
            info = shards.place(TableSpec(self.name, vocab, self.embedding_vec_size, tf.as_dtype(self.dtype).name,
                                          api="sok"))

            def local_initializer(shape, dtype=None, **_):
                return shard_initial_value(self.initializer, info, dtype or self.dtype)

            def logical_shard(next_creator, **kwargs):
                # Tagged and hooked before add_weight tracks it: a pending checkpoint restore runs then.
                shard = next_creator(**kwargs)
                tag(shard, shards.renamed(info, shard.name.split(":")[0]))
                return save_logical(shard)

            with tf.variable_creator_scope(logical_shard):
                var = self.add_weight(name="embedding_variables", shape=[info.local_rows, info.dim],
                                      initializer=local_initializer, dtype=self.dtype, trainable=True)
        var.m_var_name, var.m_key_dtype = self.m_var_name, self.key_dtype  # SOK's EmbeddingVariable attributes
        self.embedding_variable = var
        super().build(input_shape)

    @property
    def shard(self) -> ShardInfo:
        return getattr(self.embedding_variable, "_collective_shard")

    def _check_call(self):
        refuse_tf_distribute(f"sok.{type(self).__name__} call")

    def _lookup_mode(self, training):
        """Hash tables insert unseen keys in training only; ``training=False`` reads zeros for them."""
        if self.use_hashtable and training is not None and not tf.is_tensor(training) and not training:
            from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

            return hash_table.inference()
        return contextlib.nullcontext()

    def _keys(self, keys):
        if keys.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"{type(self).__name__} '{self.name}': keys must be int32 or int64, got {keys.dtype.name}")
        return keys


class DistributedEmbedding(_ShardedEmbedding):
    """SOK's combiner embedding: ``tf.nn.embedding_lookup_sparse`` on a sharded table.

    ``call(inputs)`` takes a ``tf.SparseTensor`` of keys shaped
    ``[batch * slot_num, max_nnz]`` (row ``i`` is slot ``i % slot_num`` of
    sample ``i // slot_num``) and returns ``[batch, slot_num, embedding_vec_size]``,
    each slot's keys combined by ``combiner`` (``mean`` or ``sum``); a slot
    without keys gives zeros.
    """

    def __init__(self, combiner: str, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, slot_num: int,
                 max_nnz: int, max_feature_num: int = 1, use_hashtable: bool = True, key_dtype=tf.int64,
                 embedding_initializer=_DEFAULT_INITIALIZER, **kwargs):
        choice = str(combiner).strip().lower()
        if choice not in COMBINERS:
            raise ValueError(f"DistributedEmbedding: combiner={combiner!r} is not one of {', '.join(COMBINERS)} "
                             "(case does not matter)")
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, use_hashtable, key_dtype,
                         embedding_initializer, **kwargs)
        self.combiner = choice
        self.max_nnz = _positive("DistributedEmbedding", "max_nnz", max_nnz)
        self.max_feature_num = _positive("DistributedEmbedding", "max_feature_num", max_feature_num)

    def call(self, inputs, training=True):
        # Undecorated: Keras reads this signature to find a positional ``training`` (``layer(ids, True)``).
        return self._combine(inputs, training)

    @tf.autograph.experimental.do_not_convert  # plain TensorFlow ops: converting only slows graph building
    def _combine(self, inputs, training):
        self._check_call()
        if not isinstance(inputs, tf.SparseTensor):
            raise TypeError(f"DistributedEmbedding '{self.name}' takes a tf.SparseTensor of keys shaped "
                            f"[batch * slot_num, max_nnz], got {type(inputs).__name__}")
        if inputs.shape.rank not in (None, 2):
            raise ValueError(f"DistributedEmbedding '{self.name}': keys must be 2-D [batch * slot_num, max_nnz], "
                             f"got shape {inputs.shape}")
        keys = self._keys(inputs.values)
        segments = inputs.indices[:, 0]
        with self._lookup_mode(training):
            combined = sharded.lookup_sparse(self.embedding_variable, self.shard, keys, segments, None,
                                             self.combiner, "sok")
        rows = tf.cast(inputs.dense_shape[0], tf.int32)
        missing = rows - tf.shape(combined)[0]
        combined = tf.concat([combined, tf.zeros([missing, self.embedding_vec_size], combined.dtype)], axis=0)
        return tf.reshape(combined, [-1, self.slot_num, self.embedding_vec_size])


class All2AllDenseEmbedding(_ShardedEmbedding):
    """SOK's dense embedding: ``tf.nn.embedding_lookup`` on a sharded table.

    ``call(inputs)`` takes keys ``[batch, slot_num, nnz_per_slot]`` (any shape
    whose size is ``batch * slot_num * nnz_per_slot``) and returns
    ``[batch, slot_num, nnz_per_slot, embedding_vec_size]``. With
    ``dynamic_input=True`` the keys may have any shape (e.g. from
    ``tf.unique``) and the result is ``keys.shape + [embedding_vec_size]``.
    """

    def __init__(self, max_vocabulary_size_per_gpu: int, embedding_vec_size: int, slot_num: int,
                 nnz_per_slot: int, dynamic_input: bool = False, use_hashtable: bool = True, key_dtype=tf.int64,
                 embedding_initializer=_DEFAULT_INITIALIZER, **kwargs):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, use_hashtable, key_dtype,
                         embedding_initializer, **kwargs)
        self.nnz_per_slot = _positive("All2AllDenseEmbedding", "nnz_per_slot", nnz_per_slot)
        self.dynamic_input = bool(dynamic_input)

    def call(self, inputs, training=True):
        # Undecorated: Keras reads this signature to find a positional ``training`` (``layer(ids, True)``).
        return self._look_up(inputs, training)

    @tf.autograph.experimental.do_not_convert  # plain TensorFlow ops: converting only slows graph building
    def _look_up(self, inputs, training):
        self._check_call()
        keys = self._keys(tf.convert_to_tensor(inputs))
        with self._lookup_mode(training):
            vectors = sharded.lookup(self.embedding_variable, self.shard, keys, "sok")
        if self.dynamic_input:
            return vectors
        return tf.reshape(vectors, [-1, self.slot_num, self.nnz_per_slot, self.embedding_vec_size])
