"""One worker's index of a hash-table vocabulary: key -> local row, rows handed out on first sight.

The index is kept in three int64 variables: ``keys [num_slots + 1]``,
``rows [num_slots + 1]`` and ``size``. It follows
:class:`collective.kernels.reference.HashTable` (same home slot function,
linear probing, ``INT64_MIN`` kept in the extra last slot, rows handed out
densely in order of first occurrence), so the CUDA table can replace it: its
batched insert probes all new keys in parallel, one probe step per
``tf.while_loop`` iteration, and when several new keys want the same empty
slot the earliest key in the batch takes it. Rows therefore depend only on
the order keys arrive in, never on thread timing.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tensorflow as tf

from collective import comm
from collective.embedding import key_init
from collective.embedding.hash_table import dynamic
from collective.embedding.hash_table.local_variables import eager_variable, op_name, plain_variable
from collective.embedding.hash_table.lookup_mode import is_training
from collective.kernels.reference import EMPTY_KEY
from collective.kernels.validation import check_table_shape
from collective.tf_internals import control_flow_context

HASH_INDEX_STATE_COLLECTION = "collective_hash_index_state"
"""Graph collection of the index variables (keys, rows, size): per-worker state, not logical tables."""
DEFAULT_LOAD_FACTOR = 0.5


def is_index_state(var) -> bool:
    """Whether graph variable ``var`` is one of a hash table's per-worker index variables (keys, rows, size)."""
    return any(v is var for v in tf.compat.v1.get_collection(HASH_INDEX_STATE_COLLECTION))


def home_slots(keys: tf.Tensor, num_slots: int) -> tf.Tensor:
    """Home slot of int64 ``keys``: :func:`collective.kernels.reference.hash_slots` in TensorFlow ops."""
    k = key_init.fmix64(tf.bitcast(keys, tf.uint64))
    return tf.cast(tf.bitwise.bitwise_and(k, tf.constant(num_slots - 1, tf.uint64)), tf.int64)


def _scatter(var: tf.Variable, indices: tf.Tensor, updates: tf.Tensor) -> tf.Operation:
    """``var[indices] = updates`` without reading the variable back."""
    return tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=indices, updates=updates)


class HashTable:
    """This worker's key -> row index of one hash-table vocabulary, and how new rows start.

    The object is ``ShardInfo.hash_index`` of the table's values variable and
    of its optimizer slots. Methods return graph tensors / ops.

    Args:
      name: the values variable's name (the table's name).
      dim: embedding dimension.
      capacity: rows (keys) this worker can hold.
      initializer: what a new key's vector starts as (see :mod:`collective.embedding.key_init`).
      dtype: the values' dtype.
      load_factor: fraction of probe slots that may be filled.
      index_scope: variable scope (relative to the current one) of the index variables.
    """

    def __init__(self, name: str, dim: int, capacity: int, initializer=None, dtype=tf.float32,
                 load_factor: float = DEFAULT_LOAD_FACTOR, index_scope: Optional[str] = None,
                 policy=None):
        self.name = name
        self.dim = int(dim)
        self.capacity = int(capacity)
        self.num_slots = check_table_shape(capacity, load_factor)
        self.dtype = tf.as_dtype(dtype)
        self.initial_values = key_init.KeyInitializer(initializer, name, self.dim, self.capacity, self.dtype)
        self.values: Optional[tf.Variable] = None
        self._last_insert = None
        self.load_factor = float(load_factor)
        self.policy = policy
        self.dynamic = None  # the policy's state and ops (:mod:`.dynamic`), when the table has a policy
        collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, HASH_INDEX_STATE_COLLECTION]
        if tf.executing_eagerly():
            scope = index_scope or name + "/hash_index"
            self.keys_var = eager_variable(f"{scope}/keys", [self.num_slots + 1], tf.int64,
                                           tf.compat.v1.constant_initializer(EMPTY_KEY))
            self.rows_var = eager_variable(f"{scope}/rows", [self.num_slots + 1], tf.int64,
                                           tf.compat.v1.constant_initializer(-1))
            self.size_var = eager_variable(f"{scope}/size", [], tf.int64, tf.compat.v1.zeros_initializer())
            if policy is not None:
                raise NotImplementedError(f"hash table {name}: vocabulary policies (admission, eviction) work in "
                                          "graph mode (tf.compat.v1 graphs) only")
            return
        with tf.compat.v1.variable_scope(index_scope or name + "/hash_index"):
            self.keys_var = plain_variable("keys", [self.num_slots + 1], tf.int64,
                                           tf.compat.v1.constant_initializer(EMPTY_KEY), collections)
            self.rows_var = plain_variable("rows", [self.num_slots + 1], tf.int64,
                                           tf.compat.v1.constant_initializer(-1), collections)
            self.size_var = plain_variable("size", [], tf.int64, tf.compat.v1.zeros_initializer(), collections)
            if policy is not None:
                self.dynamic = dynamic.DynamicVocabulary(self, policy, collections)

    def __repr__(self) -> str:
        return f"HashTable({self.name!r}, dim={self.dim}, capacity={self.capacity}, slots={self.num_slots})"

    @property
    def variables(self) -> List[tf.Variable]:
        """The index's state variables (per-worker, not part of any logical table), its policy's included."""
        extra = self.dynamic.variables if self.dynamic is not None else []
        return [self.keys_var, self.rows_var, self.size_var] + extra

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
        found = self.find(keys)
        missing = found < 0
        new_keys, which = tf.unique(tf.boolean_mask(keys, missing), out_idx=tf.int64)
        new_rows = self.append(new_keys)
        with tf.control_dependencies([new_rows]):
            at = tf.where(missing)
            rows = tf.tensor_scatter_nd_update(found, at, tf.gather(new_rows, which))
            new_keys = tf.identity(new_keys)
        self._remember_insert(rows)
        return rows, new_keys, new_rows

    def append(self, new_keys: tf.Tensor, partial: bool = False) -> tf.Tensor:
        """Rows for distinct keys the index does not hold: the next free rows, in order.

        When they do not all fit it fails naming the table, leaving the index
        unchanged; with ``partial`` the keys that do not fit get row -1 instead.
        """
        with tf.control_dependencies([new_keys]):  # after the inserts this one is ordered after
            start = self.size_var.read_value()
        wanted = tf.size(new_keys, out_type=tf.int64)
        if partial:
            count = tf.minimum(wanted, tf.maximum(self.capacity - start, 0))
            new_keys = new_keys[:count]
        else:
            count = wanted
            fits = tf.debugging.Assert(start + count <= self.capacity,
                                       [self.full_message(), start, count, self.FULL_ADVICE])
            with tf.control_dependencies([fits]):
                new_keys = tf.identity(new_keys)
        new_rows = start + tf.range(count)
        placed = self._place(new_keys, new_rows)
        with tf.control_dependencies([placed]):
            grown = self.size_var.assign_add(count, read_value=False)
        with tf.control_dependencies([grown]):
            return tf.concat([new_rows, -tf.ones([wanted - count], tf.int64)], axis=0)

    def full_message(self) -> str:
        """The error of a training batch whose new keys do not fit (its counts follow it)."""
        return (f"hash table {self.name} is full on worker {comm.rank()}: it holds capacity_per_worker={self.capacity} "
                "keys; keys in use and new keys in this batch:")

    FULL_ADVICE = ("Raise the capacity of the table (capacity_per_worker=; EmbeddingVariableOption(capacity_per_worker="
                   "...) for categorical_column_with_embedding; DynamicVariable(max_capacity=...)) above the number "
                   "of distinct keys a worker owns, or bound the vocabulary with a policy: "
                   "hash_embedding_variable(..., evict_strategy=lru or lfu, steps_to_live=..., min_count=...), "
                   "EmbeddingVariableOption(filter_option=CounterFilter(...), evict_option=GlobalStepEvict(...)), "
                   "DynamicVariable(evict_strategy=...) (docs/hash_tables.md, 'Dynamic vocabularies').")

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

    def rebuild(self, keys: tf.Tensor, rows: tf.Tensor) -> tf.Operation:
        """Empties the index, then holds exactly ``keys`` (distinct) at ``rows`` (``0 .. len(keys) - 1``)."""
        with tf.control_dependencies([keys, rows]):  # after whatever computed them read the index
            cleared = self.clear()
        with tf.control_dependencies([cleared]):
            placed = self._place(tf.identity(keys), rows)
        with tf.control_dependencies([placed]):
            return self.size_var.assign(tf.size(keys, out_type=tf.int64), read_value=False)

    def clear(self) -> tf.Operation:
        """Empties the index (for a restore: re-insert keys with :meth:`find_or_insert`, then write values)."""
        return tf.group(self.keys_var.assign(tf.fill([self.num_slots + 1], tf.constant(EMPTY_KEY, tf.int64))),
                        self.rows_var.assign(tf.fill([self.num_slots + 1], tf.constant(-1, tf.int64))),
                        self.size_var.assign(tf.constant(0, tf.int64)), name=f"clear_{op_name(self.name)}")

    # ------------------------------------------------------------ owner side of a lookup

    def owned_vectors(self, values: tf.Variable, keys: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
        """Vectors of keys this worker owns, read from ``values`` (this table's values or a slot).

        Training lookups insert unseen keys and write their first vectors;
        inference lookups give unseen keys zeros.
        """
        training = is_training() if training is None else training
        if self.dynamic is not None:
            return self.dynamic.owned_vectors(values, keys, training)
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
