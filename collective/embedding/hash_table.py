"""Hash-table vocabularies: embedding tables keyed by any int64, rows handed out on first sight.

A hash table is sharded like every table here: the owner of key ``k`` is
worker ``floormod(k, N)``. Each worker holds

- a values variable ``[capacity_per_worker, dim]`` (the local shard, tagged
  with a :class:`~collective.embedding.table.ShardInfo` whose ``hash_index``
  is this worker's :class:`HashTable`), trained like any sharded table
  (gradients arrive as ``IndexedSlices``; optimizer slots are sharded the
  same way), and
- an open-addressing index from key to local row, kept in three int64
  variables: ``keys [num_slots + 1]``, ``rows [num_slots + 1]`` and ``size``.

The index follows :class:`collective.kernels.reference.HashTable` (same home
slot function, linear probing, ``INT64_MIN`` kept in the extra last slot, rows
handed out densely in order of first occurrence), so the CUDA table can
replace it: its batched insert probes all new keys in parallel, one probe
step per ``tf.while_loop`` iteration, and when several new keys want the same
empty slot the earliest key in the batch takes it. Rows therefore depend only
on the order keys arrive in, never on thread timing.

A key's first vector is a function of the key alone (:mod:`.key_init`), so one
worker and N workers create the same vectors. Training lookups insert unseen
keys; lookups inside :func:`inference` (evaluation, prediction) give unseen
keys a zero vector without inserting them, which is also what an exported
SavedModel serves for them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional, Tuple

import tensorflow as tf

from collective import context, modes
from collective.embedding import key_init
from collective.embedding.table import ShardInfo, shard_of, tag
from collective.kernels.reference import EMPTY_KEY
from collective.kernels.validation import check_table_shape
from collective.tf_internals import control_flow_context
from collective.embedding.tables import creating_shard

HASH_TABLES_COLLECTION = "collective_hash_tables"
"""Graph collection of every :class:`HashTable` built in the graph."""
HASH_INDEX_STATE_COLLECTION = "collective_hash_index_state"
"""Graph collection of the index variables (keys, rows, size): per-worker state, not logical tables."""
DEFAULT_LOAD_FACTOR = 0.5

_state = threading.local()


def is_index_state(var) -> bool:
    """Whether graph variable ``var`` is one of a hash table's per-worker index variables (keys, rows, size)."""
    return any(v is var for v in tf.compat.v1.get_collection(HASH_INDEX_STATE_COLLECTION))


# ---------------------------------------------------------------- lookup mode

def is_training() -> bool:
    """Whether hash-table lookups built now insert unseen keys (False inside :func:`inference`)."""
    return getattr(_state, "training", True)


@contextlib.contextmanager
def inference() -> Iterator[None]:
    """Lookups built inside the block do not insert unseen keys; those get zero vectors.

    Build evaluation and prediction graphs inside it (DeepRec's
    EmbeddingVariable does the same: inference never grows the table).
    """
    previous = is_training()
    _state.training = False
    try:
        yield
    finally:
        _state.training = previous


def for_mode(mode: str):
    """The lookup mode of an Estimator ``mode``: :func:`inference` for ``eval``/``infer``, else training.

    ``with hash_table.for_mode(mode): spec = model_fn(features, labels, mode, ...)``
    """
    return inference() if mode in ("eval", "infer") else contextlib.nullcontext()


# ---------------------------------------------------------------- hashing

def home_slots(keys: tf.Tensor, num_slots: int) -> tf.Tensor:
    """Home slot of int64 ``keys``: :func:`collective.kernels.reference.hash_slots` in TensorFlow ops."""
    k = key_init.fmix64(tf.bitcast(keys, tf.uint64))
    return tf.cast(tf.bitwise.bitwise_and(k, tf.constant(num_slots - 1, tf.uint64)), tf.int64)


def _scatter(var: tf.Variable, indices: tf.Tensor, updates: tf.Tensor) -> tf.Operation:
    """``var[indices] = updates`` without reading the variable back."""
    return tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=indices, updates=updates)


# ---------------------------------------------------------------- the table

class HashTable:
    """This worker's key -> row index of one hash-table vocabulary, and how new rows start.

    The object is ``ShardInfo.hash_index`` of the table's values variable and
    of its optimizer slots. Methods return graph tensors / ops.

    Args:
      name: the values variable's name (the table's name).
      dim: embedding dimension.
      capacity: rows (keys) this worker can hold.
      initializer: what a new key's vector starts as (see :mod:`.key_init`).
      dtype: the values' dtype.
      load_factor: fraction of probe slots that may be filled.
      index_scope: variable scope (relative to the current one) of the index variables.
    """

    def __init__(self, name: str, dim: int, capacity: int, initializer=None, dtype=tf.float32,
                 load_factor: float = DEFAULT_LOAD_FACTOR, index_scope: Optional[str] = None):
        self.name = name
        self.dim = int(dim)
        self.capacity = int(capacity)
        self.num_slots = check_table_shape(capacity, load_factor)
        self.dtype = tf.as_dtype(dtype)
        self.initial_values = key_init.KeyInitializer(initializer, name, self.dim, self.capacity, self.dtype)
        self.values: Optional[tf.Variable] = None
        self._last_insert = None
        collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, HASH_INDEX_STATE_COLLECTION]
        if tf.executing_eagerly():
            scope = index_scope or name + "/hash_index"
            self.keys_var = _eager_variable(f"{scope}/keys", [self.num_slots + 1], tf.int64,
                                            tf.compat.v1.constant_initializer(EMPTY_KEY))
            self.rows_var = _eager_variable(f"{scope}/rows", [self.num_slots + 1], tf.int64,
                                            tf.compat.v1.constant_initializer(-1))
            self.size_var = _eager_variable(f"{scope}/size", [], tf.int64, tf.compat.v1.zeros_initializer())
            return
        with tf.compat.v1.variable_scope(index_scope or name + "/hash_index"):
            self.keys_var = _plain_variable("keys", [self.num_slots + 1], tf.int64,
                                            tf.compat.v1.constant_initializer(EMPTY_KEY), collections)
            self.rows_var = _plain_variable("rows", [self.num_slots + 1], tf.int64,
                                            tf.compat.v1.constant_initializer(-1), collections)
            self.size_var = _plain_variable("size", [], tf.int64, tf.compat.v1.zeros_initializer(), collections)

    def __repr__(self) -> str:
        return f"HashTable({self.name!r}, dim={self.dim}, capacity={self.capacity}, slots={self.num_slots})"

    @property
    def variables(self):
        """The index's state variables (per-worker, not part of any logical table)."""
        return [self.keys_var, self.rows_var, self.size_var]

    def size(self) -> tf.Tensor:
        """Keys held on this worker."""
        return self.size_var.read_value()

    # ------------------------------------------------------------ lookups

    def find(self, keys: tf.Tensor) -> tf.Tensor:
        """Local row of each int64 key, -1 for keys this worker does not hold."""
        keys = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        mask = self.num_slots - 1
        special = tf.equal(keys, EMPTY_KEY)

        def body(i, pos, active, rows):
            held = tf.gather(self.keys_var, pos)
            hit = tf.logical_and(active, tf.equal(held, keys))
            rows = tf.where(hit, tf.gather(self.rows_var, pos), rows)
            active = tf.logical_and(tf.logical_and(active, tf.logical_not(hit)), tf.not_equal(held, EMPTY_KEY))
            return i + 1, tf.bitwise.bitwise_and(pos + 1, mask), active, rows

        _, _, _, rows = tf.while_loop(
            lambda i, pos, active, rows: tf.logical_and(i < self.num_slots, tf.reduce_any(active)), body,
            [tf.constant(0), home_slots(keys, self.num_slots), tf.logical_not(special), -tf.ones_like(keys)])
        with tf.control_dependencies([rows]):  # read after the inserts this find is ordered after
            special_row = tf.gather(self.rows_var, self.num_slots)
        return tf.where(special, tf.fill(tf.shape(keys), special_row), rows)

    def find_or_insert(self, keys: tf.Tensor) -> tf.Tensor:
        """Local row of each key, inserting the keys not yet held (values rows are left as they are).

        Fails, leaving the index unchanged, when the new keys do not fit; the
        error names the table and says to raise its capacity.
        """
        return self._insert(keys)[0]

    def _insert(self, keys: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(rows of keys, new keys, their rows)``; the index holds every key once it has run."""
        keys = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        with tf.control_dependencies(self._after_previous_insert()):
            keys = tf.identity(keys)
            start = self.size_var.read_value()
        found = self.find(keys)
        missing = found < 0
        new_keys, which = tf.unique(tf.boolean_mask(keys, missing), out_idx=tf.int64)
        count = tf.size(new_keys, out_type=tf.int64)
        fits = tf.debugging.Assert(
            start + count <= self.capacity,
            [f"hash table {self.name} is full on worker {context.get().rank}: it holds "
             f"capacity_per_worker={self.capacity} keys; keys in use and new keys in this batch:", start, count,
             "Raise the capacity of the table (capacity_per_worker, or "
             "EmbeddingVariableOption(capacity_per_worker=...) for categorical_column_with_embedding) above the "
             "number of distinct keys a worker owns."])
        with tf.control_dependencies([fits]):
            new_keys, new_rows = tf.identity(new_keys), start + tf.range(count)
        placed = self._place(new_keys, new_rows)
        with tf.control_dependencies([placed]):
            grown = self.size_var.assign_add(count, read_value=False)
        with tf.control_dependencies([grown]):
            at = tf.where(missing)
            rows = tf.tensor_scatter_nd_update(found, at, tf.gather(new_rows, which))
            new_keys, new_rows = tf.identity(new_keys), tf.identity(new_rows)
        self._remember_insert(rows)
        return rows, new_keys, new_rows

    def _remember_insert(self, rows: tf.Tensor) -> None:
        """Orders later graph lookups after this insert (eager code runs in order anyway)."""
        if not tf.executing_eagerly():
            self._last_insert = (rows.op, _control_flow_context())

    def _after_previous_insert(self):
        """Serialises inserts into this table built in the same graph and control-flow context."""
        if self._last_insert is None or tf.executing_eagerly():
            return []
        op, ctx = self._last_insert
        if op.graph is not tf.compat.v1.get_default_graph() or ctx is not _control_flow_context():
            return []
        return [op]

    def _place(self, new_keys: tf.Tensor, new_rows: tf.Tensor) -> tf.Operation:
        """Writes distinct absent keys into free slots, all keys probing in parallel."""
        mask = self.num_slots - 1
        special = tf.equal(new_keys, EMPTY_KEY)
        index = tf.range(tf.size(new_keys, out_type=tf.int64))

        def body(i, pos, pending):
            held = tf.gather(self.keys_var, pos)
            wants = tf.logical_and(pending, tf.equal(held, EMPTY_KEY))
            who = tf.boolean_mask(index, wants)
            slots, slot_of = tf.unique(tf.boolean_mask(pos, wants), out_idx=tf.int64)
            # The earliest key asking for a free slot gets it; the others probe on.
            winners = tf.math.unsorted_segment_min(who, slot_of, tf.size(slots, out_type=tf.int64))
            writes = [_scatter(self.keys_var, slots, tf.gather(new_keys, winners)),
                      _scatter(self.rows_var, slots, tf.gather(new_rows, winners))]
            won = tf.scatter_nd(winners[:, None], tf.ones_like(winners), tf.shape(index, out_type=tf.int64)) > 0
            pending = tf.logical_and(pending, tf.logical_not(won))
            with tf.control_dependencies(writes):
                pos = tf.where(pending, tf.bitwise.bitwise_and(pos + 1, mask), pos)
            return i + 1, pos, pending

        _, pos, _ = tf.while_loop(
            lambda i, pos, pending: tf.logical_and(i < self.num_slots, tf.reduce_any(pending)), body,
            [tf.constant(0), home_slots(new_keys, self.num_slots), tf.logical_not(special)])
        with tf.control_dependencies([pos]):
            special_rows = tf.boolean_mask(new_rows, special)
            return _scatter(self.rows_var, tf.fill(tf.shape(special_rows), tf.constant(self.num_slots, tf.int64)),
                            special_rows)

    def entries(self) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(keys, rows)`` held on this worker, ordered by row."""
        rows = self.rows_var.read_value()
        held = rows >= 0
        keys, rows = tf.boolean_mask(self.keys_var.read_value(), held), tf.boolean_mask(rows, held)
        order = tf.argsort(rows)
        return tf.gather(keys, order), tf.gather(rows, order)

    def clear(self) -> tf.Operation:
        """Empties the index (for a restore: re-insert keys with :meth:`find_or_insert`, then write values)."""
        return tf.group(self.keys_var.assign(tf.fill([self.num_slots + 1], tf.constant(EMPTY_KEY, tf.int64))),
                        self.rows_var.assign(tf.fill([self.num_slots + 1], tf.constant(-1, tf.int64))),
                        self.size_var.assign(tf.constant(0, tf.int64)), name=f"clear_{_op_name(self.name)}")

    # ------------------------------------------------------------ owner side of a lookup

    def owned_vectors(self, values: tf.Variable, keys: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
        """Vectors of keys this worker owns, read from ``values`` (this table's values or a slot).

        Training lookups insert unseen keys and write their first vectors;
        inference lookups give unseen keys zeros.
        """
        training = is_training() if training is None else training
        if training:
            rows, new_keys, new_rows = self._insert(keys)
            init = _scatter(values, new_rows, self.initial_values(new_keys))
            with tf.control_dependencies([init]):
                rows = tf.identity(rows)
            # A later lookup may find these keys: it must read their rows after they are written.
            self._remember_insert(rows)
            return tf.gather(values, rows)
        rows = self.find(keys)
        vectors = tf.gather(values, tf.maximum(rows, 0))
        return tf.where((rows >= 0)[:, None], vectors, tf.zeros_like(vectors))


def _control_flow_context():
    return control_flow_context(tf.compat.v1.get_default_graph())


def _op_name(name: str) -> str:
    return name.replace("/", "_").replace(":", "_")


def _eager_variable(name: str, shape, dtype, initializer, trainable: bool = False) -> tf.Variable:
    """A hash table's variable in TF2 eager code (Keras builds layers eagerly, also under ``tf.function``)."""
    return tf.Variable(initializer(shape, dtype=dtype), trainable=trainable, name=name, dtype=dtype)


def _plain_variable(name, shape, dtype, initializer, collections, trainable=False) -> tf.Variable:
    """``get_variable`` in the current scope with its custom getters and partitioner switched off.

    Inside ``embedding_scope()`` a 2-D trainable variable would otherwise be
    re-sharded as a ``[vocab, dim]`` table; a hash table's variables are
    already per-worker. Trainable ones are created non-trainable (so no
    variable creator shards them) and then marked trainable.
    """
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), auxiliary_name_scope=False) as scope:
        scope.set_custom_getter(None)
        scope.set_partitioner(None)
        var = tf.compat.v1.get_variable(name, shape=shape, dtype=dtype, initializer=initializer, trainable=False,
                                        collections=list(collections), use_resource=True)
    if trainable:
        var._trainable = True  # pylint: disable=protected-access
        if var not in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, var)
    return var


# ---------------------------------------------------------------- creation

def table_of(var) -> Optional[HashTable]:
    """The :class:`HashTable` behind a hash-table values variable (or one of its slots), else None."""
    info = shard_of(var)
    return info.hash_index if info is not None else None


def _find_existing(full_name: str) -> Optional[HashTable]:
    for table in tf.compat.v1.get_collection(HASH_TABLES_COLLECTION):
        if table.name == full_name:
            return table
    return None


def _full_name(name: str) -> str:
    scope = tf.compat.v1.get_variable_scope().name
    return f"{scope}/{name}" if scope else name


def hash_embedding_variable(name: str, dim: int, capacity_per_worker: int, initializer=None,
                            dtype=tf.float32, key_dtype=tf.int64, trainable: bool = True,
                            load_factor: float = DEFAULT_LOAD_FACTOR,
                            collections=None):
    """A sharded embedding table with a hash-table vocabulary: keys of any int64 value.

    Inside ``CollectiveStrategy.scope()``, ``tf.nn.embedding_lookup`` and
    ``tf.nn.embedding_lookup_sparse`` on the returned variable exchange keys
    with their owners (``floormod(key, N)``), which map them to rows, adding
    unseen keys in training (see :func:`inference`).

    Args:
      name: variable name, in the current variable scope (reused when it exists).
      dim: embedding dimension.
      capacity_per_worker: most keys one worker holds (SOK's
        ``max_vocabulary_size_per_gpu``); a batch that would exceed it fails
        with an error naming the table.
      initializer: a new key's first vector (see :mod:`collective.embedding.key_init`
        for the supported initialisers; default uniform in [-0.05, 0.05] as SOK).
      dtype: dtype of the values.
      key_dtype: ``tf.int64`` or ``tf.int32`` (keys are looked up as int64 either way).
      trainable: whether optimizers train it.
      load_factor: fraction of the index's probe slots that may be filled.
      collections: collections of the values variable (default global variables).

    Returns:
      The values variable ``[capacity_per_worker, dim]``, tagged as a shard
      whose ``ShardInfo.hash_index`` is this worker's :class:`HashTable`. In
      export mode (``collective.modes.exporting``) a plain ``[rows, dim]``
      variable with a ``tf.lookup`` key -> row table instead (see :func:`exported`).
    """
    if tf.as_dtype(key_dtype) not in (tf.int64, tf.int32):
        raise TypeError(f"hash table '{name}': key_dtype must be tf.int64 or tf.int32, got {key_dtype!r}; "
                        "hash string keys to int64 first (collective.hash_embedding_column does)")
    if int(capacity_per_worker) < 1:
        raise ValueError(f"hash table '{name}': capacity_per_worker must be >= 1, got {capacity_per_worker!r}")
    if modes.is_exporting():
        return export_variable(name, dim, dtype)
    if tf.executing_eagerly():
        return _eager_hash_embedding_variable(name, dim, capacity_per_worker, initializer, dtype, trainable,
                                              load_factor)
    full_name = _full_name(name)
    existing = _find_existing(full_name)
    if existing is not None:
        return existing.values
    ctx = context.get()
    collections = list(collections or [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    info = ShardInfo(name=full_name, vocab=int(capacity_per_worker) * ctx.world_size, dim=int(dim), rank=ctx.rank,
                     world_size=ctx.world_size)
    with creating_shard(info):
        values = _plain_variable(name, [int(capacity_per_worker), int(dim)], tf.as_dtype(dtype),
                                 tf.compat.v1.zeros_initializer(), collections, trainable=trainable)
        table = HashTable(values.op.name, dim, capacity_per_worker, initializer, dtype, load_factor,
                          index_scope=name + "/hash_index")
    table.values = values
    tf.compat.v1.add_to_collection(HASH_TABLES_COLLECTION, table)
    return tag(values, ShardInfo(name=values.op.name, vocab=info.vocab, dim=info.dim, rank=ctx.rank,
                                 world_size=ctx.world_size, hash_index=table))


def _eager_hash_embedding_variable(name: str, dim: int, capacity_per_worker: int, initializer, dtype,
                                   trainable: bool, load_factor: float) -> tf.Variable:
    """:func:`hash_embedding_variable` in eager code: plain ``tf.Variable`` objects, no graph collections.

    The caller tracks them (a Keras layer adds the values as a trainable
    weight and ``table_of(values).variables`` as non-trainable ones), so
    ``tf.train.Checkpoint`` and ``model.save_weights`` keep this worker's table.
    """
    ctx = context.get()
    values = _eager_variable(name, [int(capacity_per_worker), int(dim)], tf.as_dtype(dtype),
                             tf.compat.v1.zeros_initializer(), trainable=trainable)
    full_name = values.name.split(":")[0]
    table = HashTable(full_name, dim, capacity_per_worker, initializer, dtype, load_factor,
                      index_scope=name + "/hash_index")
    table.values = values
    return tag(values, ShardInfo(name=full_name, vocab=int(capacity_per_worker) * ctx.world_size, dim=int(dim),
                                 rank=ctx.rank, world_size=ctx.world_size, hash_index=table))


# ---------------------------------------------------------------- export mode

class ExportedTable:
    """The plain form of a hash table in an export graph: key -> row ``tf.lookup`` table + ``[rows, dim]`` values.

    Keys the lookup table does not hold read a zero vector (row ``rows`` of
    :meth:`padded`). It is the ``hash_index`` of the export variable's
    one-worker ``ShardInfo``, so the exchange (and, inside ``scope()``,
    ``tf.nn.embedding_lookup``) serve the export variable through
    :meth:`owned_vectors` with TensorFlow ops only.
    """

    def __init__(self, name: str, values: tf.Variable, index, rows: int):
        self.name, self.values, self.index, self.rows = name, values, index, rows
        self.capacity = rows

    def owned_vectors(self, values: tf.Variable, keys: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
        """:meth:`HashTable.owned_vectors` of the export form: never inserts."""
        del values, training
        return self.lookup(tf.reshape(keys, [-1]))

    def rows_of(self, keys: tf.Tensor) -> tf.Tensor:
        """Row of each key in :meth:`padded` (the zero row for keys not held)."""
        found = self.index.lookup(tf.cast(keys, tf.int64))
        return tf.where(found >= 0, found, tf.fill(tf.shape(found), tf.constant(self.rows, tf.int64)))

    def padded(self) -> tf.Tensor:
        """The values with one zero row appended."""
        return tf.concat([self.values, tf.zeros([1, self.values.shape[1]], self.values.dtype)], axis=0)

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Vectors of ``keys`` (any shape), zeros for keys not held."""
        return tf.gather(self.padded(), self.rows_of(keys))


def exported(var) -> Optional[ExportedTable]:
    """The :class:`ExportedTable` of an export-mode hash-table variable, else None."""
    return getattr(var, "_collective_exported_hash_table", None)


def export_index(name: str, full_name: str):
    """The key -> row lookup table of an export, registered in ``modes.EXPORT_HASH_INDEXES`` once per table."""
    for registered, index in tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES):
        if registered == full_name:
            return index
    # At the root name scope, so that the op name equals the table's name: a TF1 SavedModel refers to
    # a MutableHashTable's saveable by the unscoped name and fails to load otherwise.
    with tf.compat.v1.get_default_graph().name_scope(None):
        index = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1,
                                                        name=f"{_op_name(full_name)}_hash_index")
    tf.compat.v1.add_to_collection(modes.EXPORT_HASH_INDEXES, (full_name, index))
    return index


def export_variable(name: str, dim: int, dtype=tf.float32) -> tf.Variable:
    """The export form of hash table ``name``: a ``[rows, dim]`` variable named as the table.

    ``rows`` comes from the checkpoint (:func:`collective.modes.export_rows`).
    """
    full_name = _full_name(name)
    rows = modes.export_rows(full_name)
    values = _plain_variable(name, [rows, int(dim)], tf.as_dtype(dtype), tf.compat.v1.zeros_initializer(),
                             [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    table = ExportedTable(full_name, values, export_index(name, full_name), rows)
    values._collective_exported_hash_table = table  # pylint: disable=protected-access
    # A one-worker ShardInfo (not in the sharded-table collection): lookups route to ``table``.
    values._collective_shard = ShardInfo(  # pylint: disable=protected-access
        name=values.op.name, vocab=rows, dim=int(dim), rank=0, world_size=1, hash_index=table)
    return values
