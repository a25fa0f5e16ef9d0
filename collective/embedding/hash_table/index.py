"""One worker's index of a hash-table vocabulary: key -> local row, rows handed out on first sight.

The index is kept in three int64 variables: ``keys [num_slots + 1]``,
``rows [num_slots + 1]`` and ``size``. It follows
:class:`collective.kernels.reference.HashTable` (same home slot function,
linear probing, ``INT64_MIN`` kept in the extra last slot, rows handed out
densely in order of first occurrence), so the CUDA table can replace it: its
batched insert probes all new keys in parallel, one probe step per
``tf.while_loop`` iteration, and when several new keys want the same empty
slot the earliest key in the batch takes it. Rows therefore depend only on
the order keys arrive in, never on thread timing, nor on the allocation: a
growing index (:mod:`.growth`) has ``keys``/``rows`` of unknown length, read
as a tensor by the probe loops.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from collective import comm
from collective.embedding import key_init, masking, traced
from collective.embedding.hash_table import dynamic, growth
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


def home_slots(keys: tf.Tensor, num_slots: Union[int, tf.Tensor]) -> tf.Tensor:
    """Home slot of int64 ``keys``: :func:`collective.kernels.reference.hash_slots` in TensorFlow ops."""
    k = key_init.fmix64(tf.bitcast(keys, tf.uint64))
    mask = tf.cast(num_slots - 1, tf.uint64) if tf.is_tensor(num_slots) else tf.constant(num_slots - 1, tf.uint64)
    return tf.cast(tf.bitwise.bitwise_and(k, mask), tf.int64)


def _scatter(var: Union[tf.Variable, tf.Tensor], indices: tf.Tensor, updates: tf.Tensor) -> tf.Operation:
    """``var[indices] = updates`` without reading the variable back (``var``: a variable or its resource handle)."""
    return tf.raw_ops.ResourceScatterUpdate(resource=getattr(var, "handle", var), indices=indices, updates=updates)


class HashTable:
    """This worker's key -> row index of one hash-table vocabulary, and how new rows start.

    The object is ``ShardInfo.hash_index`` of the table's values variable and
    of its optimizer slots. Methods return graph tensors / ops.

    Args:
      name: the values variable's name (the table's name).
      dim: embedding dimension.
      capacity: rows (keys) this worker can hold.
      initial_capacity: rows allocated at first when below ``capacity``: the
        table then grows up to ``capacity`` (:mod:`.growth`; graph mode only).
      initializer: what a new key's vector starts as (see :mod:`collective.embedding.key_init`).
      dtype: the values' dtype.
      load_factor: fraction of probe slots that may be filled.
      index_scope: variable scope (relative to the current one) of the index variables.
      initializer_rows: the rows a variance-scaling initializer takes its fan from (default ``capacity``): the
        per-worker capacity of a table-wise table, so its first vectors are the row-wise table's.
    """

    def __init__(self, name: str, dim: int, capacity: int, initializer=None, dtype=tf.float32,
                 load_factor: float = DEFAULT_LOAD_FACTOR, index_scope: Optional[str] = None,
                 policy=None, initial_capacity: Optional[int] = None, initializer_rows: Optional[int] = None):
        self.name = name
        self.dim = int(dim)
        self.capacity = int(capacity)
        # A table-wise table's rank holding none of its keys has capacity 0: a minimal index it never fills.
        self.num_slots = check_table_shape(max(1, self.capacity), load_factor)  # of a growing table: at its capacity
        self.growth = None
        if initial_capacity is not None and int(initial_capacity) < self.capacity:
            self.growth = growth.Growth(name, self.capacity, int(initial_capacity), load_factor)
            if len(self.growth.slots) == 1:  # the initial rows already take as many slots as the capacity
                self.growth = None
        self.dtype = tf.as_dtype(dtype)
        self.initial_values = key_init.KeyInitializer(initializer, name, self.dim, initializer_rows or self.capacity,
                                                      self.dtype)
        self.values: Optional[tf.Variable] = None
        self._last_insert = None
        self.load_factor = float(load_factor)
        self.policy = policy
        self.dynamic = None  # the policy's state and ops (:mod:`.dynamic`), when the table has a policy
        collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, HASH_INDEX_STATE_COLLECTION]
        if tf.executing_eagerly():
            if self.growth is not None:
                raise NotImplementedError(f"hash table {name}: growing from initial_capacity_per_worker works in "
                                          "graph mode (tf.compat.v1 graphs) only; allocate it at its capacity")
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
            self.keys_var = self._slot_array("keys", EMPTY_KEY, collections)
            self.rows_var = self._slot_array("rows", -1, collections)
            self.size_var = plain_variable("size", [], tf.int64, tf.compat.v1.zeros_initializer(), collections)
            if policy is not None:
                self.dynamic = dynamic.DynamicVocabulary(self, policy, collections)

    def _slot_array(self, name: str, empty: int, collections: List[str]) -> tf.Variable:
        if self.growth is None:
            return plain_variable(name, [self.num_slots + 1], tf.int64, tf.compat.v1.constant_initializer(empty),
                                  collections)
        first = self.growth.slots[0] + 1
        return plain_variable(name, [None], tf.int64,
                              lambda: tf.fill([growth.hidden(first)], tf.constant(empty, tf.int64)), collections)

    def __repr__(self) -> str:
        grows = "" if self.growth is None else f", initial={self.growth.sizes[0]}"
        return f"HashTable({self.name!r}, dim={self.dim}, capacity={self.capacity}{grows}, slots={self.num_slots})"

    # ------------------------------------------------------------ allocation (see :mod:`.growth`)

    def row_variable(self, name: str, shape: Sequence[int], dtype: tf.DType, collections: List[str],
                     fill=0) -> tf.Variable:
        """A per-worker variable of one ``shape`` row per key (``[capacity] + shape``), rows starting as ``fill``.

        A growing table allocates its initial rows and grows the variable with its index.
        """
        dtype = tf.as_dtype(dtype)
        if self.growth is None:
            return plain_variable(name, [self.capacity] + list(shape), dtype,
                                  tf.compat.v1.constant_initializer(fill), collections)
        rows = self.growth.sizes[0]
        var = plain_variable(name, [None] + list(shape), dtype,
                             lambda: tf.fill([growth.hidden(rows)] + list(shape), tf.constant(fill, dtype)),
                             collections)
        self.grows_with_index(var, fill)
        return var

    def grows_with_index(self, var: tf.Variable, fill=0) -> None:
        """Registers per-row ``var`` (first dimension unknown) of a growing table: it grows with the index."""
        if self.growth is not None and self.growth.fill_of(var) is None:
            row = np.full(var.shape[1:].as_list(), fill, var.dtype.base_dtype.as_numpy_dtype)
            self.growth.with_index.append((var, row))

    def allocated(self) -> Union[int, tf.Tensor]:
        """Rows the index holds room for now: the capacity, or a growing table's current size (int64 tensor)."""
        if self.growth is None:
            return self.capacity
        sizes = tf.constant(self.growth.sizes, tf.int64)
        step = tf.reduce_sum(tf.cast(tf.constant(self.growth.slots, tf.int64) < self._slot_count(), tf.int32))
        return tf.gather(sizes, tf.minimum(step, len(self.growth.sizes) - 1))

    def rows_of(self, var: tf.Variable) -> Union[int, tf.Tensor]:
        """Rows of per-row variable ``var`` (values, a slot, ``usage``): the capacity unless the table grows."""
        return self.capacity if self.growth is None else growth.shape_of_rows(var)

    def catch_up(self, var: tf.Variable, fill=None) -> Optional[tf.Operation]:
        """Op growing per-row ``var`` (registered, or with rows of ``fill``) to the index's allocation; None when
        the table does not grow or ``var`` grows with the index."""
        if self.growth is None or any(var is known for known, _ in self.growth.with_index):
            return None  # grown with the index
        row = self.growth.fill_of(var) if fill is None else \
            np.full(var.shape[1:].as_list(), fill, var.dtype.base_dtype.as_numpy_dtype)
        if row is None:  # a slot made where no listener registered it: its initial value says how it starts
            row = growth.initial_row(var, self.name)
        return growth.grow_variable(var, self.allocated(), row)

    def _slot_count(self) -> Union[int, tf.Tensor]:
        """Probe slots now (not counting the extra one): static, or read from a growing index's keys array."""
        if self.growth is None:
            return self.num_slots
        return growth.shape_of_rows(self.keys_var) - 1

    def _grow_to(self, needed: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """Grows to the first size holding ``needed`` rows when the allocation is smaller.

        The probe arrays are emptied at their new size and the variables grown
        with the index padded; returns the held ``(keys, rows)`` the caller
        places again with its new keys (one probe loop), or empty tensors when
        it did not grow.
        """
        plan = self.growth

        def grow():
            step = tf.reduce_sum(tf.cast(tf.constant(plan.sizes, tf.int64) < needed, tf.int32))
            step = tf.minimum(step, len(plan.sizes) - 1)
            size = tf.gather(tf.constant(plan.sizes, tf.int64), step)
            slots = tf.gather(tf.constant(plan.slots, tf.int64), step)
            keys, rows = self.entries()
            with tf.control_dependencies([keys, rows]):
                resized = [self._reset_slots(slots)]
            for var, row in plan.with_index:
                value = tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=var.dtype.base_dtype)
                resized.append(tf.raw_ops.AssignVariableOp(
                    resource=var.handle, value=growth.padded(value, growth.shape_of_rows(var), size, row)))
            with tf.control_dependencies(resized):
                return tf.identity(keys), tf.identity(rows)

        def keep():
            return tf.zeros([0], tf.int64), tf.zeros([0], tf.int64)

        return tf.cond(needed > self.allocated(), grow, keep)

    def _reset_slots(self, slots) -> tf.Operation:
        """Empties the probe arrays, ``slots + 1`` long (the size is kept by :meth:`clear`)."""
        return tf.group(
            self.keys_var.assign(tf.fill([slots + 1], tf.constant(EMPTY_KEY, tf.int64)), read_value=False),
            self.rows_var.assign(tf.fill([slots + 1], tf.constant(-1, tf.int64)), read_value=False))

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
        with tf.control_dependencies([keys] if self.growth is not None else []):  # after a growth ordered before
            num_slots = self._slot_count()
        special = tf.equal(keys, EMPTY_KEY)
        rows = traced.once(_probe_for_keys)(self.keys_var.handle, self.rows_var.handle, keys, _as_int64(num_slots))
        with tf.control_dependencies([rows]):  # read after the inserts this find is ordered after
            special_row = tf.gather(self.rows_var, num_slots)
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
        new_keys, which = tf.unique(masking.select(keys, missing), out_idx=tf.int64)
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
        if self.growth is None:
            placed = self._place(new_keys, new_rows)
        else:  # after a growth the held keys are placed again with the new ones, in the same probe loop
            held_keys, held_rows = self._grow_to(tf.minimum(start + count, self.capacity))
            placed = self._place(tf.concat([held_keys, new_keys], 0), tf.concat([held_rows, new_rows], 0))
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
        with tf.control_dependencies([new_keys] if self.growth is not None else []):  # after a growth before
            num_slots = self._slot_count()
        num_slots = _as_int64(num_slots)
        place = traced.once(_probe_and_place)
        placed = place(self.keys_var.handle, self.rows_var.handle, new_keys, new_rows, num_slots)
        with tf.control_dependencies([placed]):
            special_rows = masking.select(new_rows, tf.equal(new_keys, EMPTY_KEY))
            return _scatter(self.rows_var, tf.fill(tf.shape(special_rows), num_slots), special_rows)

    def entries(self) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(keys, rows)`` held on this worker, ordered by row."""
        rows = self.rows_var.read_value()
        held = rows >= 0
        keys, rows = masking.select(self.keys_var.read_value(), held), masking.select(rows, held)
        order = tf.argsort(rows)
        return tf.gather(keys, order), tf.gather(rows, order)

    def rebuild(self, keys: tf.Tensor, rows: tf.Tensor) -> tf.Operation:
        """Empties the index, then holds exactly ``keys`` (distinct) at ``rows`` (``0 .. len(keys) - 1``)."""
        with tf.control_dependencies([keys, rows]):  # after whatever computed them read the index
            if self.growth is None:
                cleared = self.clear()
            else:  # keeps the slots it has grown to
                cleared = tf.group(self._reset_slots(self._slot_count()), self.size_var.assign(tf.constant(0, tf.int64), read_value=False))
        with tf.control_dependencies([cleared]):
            placed = self._place(tf.identity(keys), rows)
        with tf.control_dependencies([placed]):
            return self.size_var.assign(tf.size(keys, out_type=tf.int64), read_value=False)

    def clear(self) -> tf.Operation:
        """Empties the index (for a restore: re-insert keys with :meth:`find_or_insert`, then write values).

        A growing index goes back to its initial slots (the other per-row variables keep their rows).
        """
        slots = self.num_slots if self.growth is None else growth.hidden(self.growth.slots[0])
        return tf.group(self.keys_var.assign(tf.fill([slots + 1], tf.constant(EMPTY_KEY, tf.int64))),
                        self.rows_var.assign(tf.fill([slots + 1], tf.constant(-1, tf.int64))),
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


def _gather(var: tf.Tensor, pos: tf.Tensor) -> tf.Tensor:
    """``var[pos]`` of an int64 probe array passed to a probe loop as a resource handle (of unknown shape)."""
    held = tf.raw_ops.ResourceGather(resource=var, indices=pos, dtype=tf.int64)
    held.set_shape(pos.shape)
    return held


def _as_int64(bound: Union[int, tf.Tensor]) -> tf.Tensor:
    """A probe-slot count (a Python int, or a growing index's int64 tensor) as an int64 tensor."""
    return tf.cast(bound, tf.int64) if tf.is_tensor(bound) else tf.constant(bound, tf.int64)


# The probe loops are functions that every table's lookups call, traced once per process (traced.once): a loop
# built in place costs each table about a tenth of a second of graph construction (tracing its condition and body).
_PROBE_ARGS = [tf.TensorSpec([], tf.resource), tf.TensorSpec([], tf.resource), tf.TensorSpec([None], tf.int64)]


@tf.function(input_signature=_PROBE_ARGS + [tf.TensorSpec([], tf.int64)], autograph=False)
def _probe_for_keys(keys_var, rows_var, keys, num_slots):
    """Row of each key in the index's probe arrays (``keys_var``, ``rows_var``: resource handles), -1 when
    absent; ``EMPTY_KEY`` is left to the caller (it lives in the extra last slot)."""
    mask = num_slots - 1

    def body(i, pos, active, rows):
        held = _gather(keys_var, pos)
        hit = tf.logical_and(active, tf.equal(held, keys))
        rows = tf.where(hit, _gather(rows_var, pos), rows)
        active = tf.logical_and(tf.logical_and(active, tf.logical_not(hit)), tf.not_equal(held, EMPTY_KEY))
        return i + 1, tf.bitwise.bitwise_and(pos + 1, mask), active, rows

    _, _, _, rows = tf.while_loop(
        lambda i, pos, active, rows: tf.logical_and(i < num_slots, tf.reduce_any(active)), body,
        [tf.constant(0, tf.int64), home_slots(keys, num_slots), tf.not_equal(keys, EMPTY_KEY), -tf.ones_like(keys)])
    return rows


@tf.function(input_signature=_PROBE_ARGS + [tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)],
             autograph=False)
def _probe_and_place(keys_var, rows_var, new_keys, new_rows, num_slots):
    """Writes distinct absent ``new_keys`` (``EMPTY_KEY`` aside) and their ``new_rows`` into free probe slots,
    all keys probing in parallel; returns each key's final probe position."""
    mask = num_slots - 1
    index = tf.range(tf.size(new_keys, out_type=tf.int64))

    def body(i, pos, pending):
        held = _gather(keys_var, pos)
        wants = tf.logical_and(pending, tf.equal(held, EMPTY_KEY))
        who = masking.select(index, wants)
        slots, slot_of = tf.unique(masking.select(pos, wants), out_idx=tf.int64)
        # The earliest key asking for a free slot gets it; the others probe on.
        winners = tf.math.unsorted_segment_min(who, slot_of, tf.size(slots, out_type=tf.int64))
        writes = [_scatter(keys_var, slots, tf.gather(new_keys, winners)),
                  _scatter(rows_var, slots, tf.gather(new_rows, winners))]
        won = tf.scatter_nd(winners[:, None], tf.ones_like(winners), tf.shape(index, out_type=tf.int64)) > 0
        pending = tf.logical_and(pending, tf.logical_not(won))
        with tf.control_dependencies(writes):
            pos = tf.where(pending, tf.bitwise.bitwise_and(pos + 1, mask), pos)
        return i + 1, pos, pending

    _, pos, _ = tf.while_loop(
        lambda i, pos, pending: tf.logical_and(i < num_slots, tf.reduce_any(pending)), body,
        [tf.constant(0, tf.int64), home_slots(new_keys, num_slots), tf.not_equal(new_keys, EMPTY_KEY)])
    return pos
