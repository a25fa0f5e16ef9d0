"""A hash table's :class:`~.policy.VocabularyPolicy` at work: counts, admission, eviction, freed rows reused.

State on each worker, beside the index (``<table>/hash_index/...``):

- ``usage [capacity, 2]`` int64: per row, how many training lookups saw the
  key (its count when admitted included) and the global step of the last one;
- with ``min_count > 1``, the counter table: a second index
  ``admission/{keys,rows,size}`` over keys not admitted yet, its
  ``admission/usage [counter_capacity, 2]`` (count, last step) and
  ``admission/dropped`` (keys not counted because it was full).

A training lookup on the owner (:meth:`DynamicVocabulary.owned_vectors`)
counts each distinct key it received once: held keys get ``count + 1`` and
the step; other keys are counted in the counter table and admitted once they
reach ``min_count``; keys without a row read ``default_value`` and send no
gradient row. Eviction (:meth:`DynamicVocabulary.upkeep`) runs after the
optimizer's update when the new global step is a multiple of
``evict_every_steps``: it decides per key (age, norm, or one LRU/LFU
threshold agreed by an allreduce), then compacts the survivors to rows
``0 .. K-1`` of the values, the usage, every optimizer slot and the
per-row masks its caller names (the incremental-checkpoint mask), resets the freed rows (slots to their initial
value) and rebuilds the index, so later inserts reuse the rows.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from collective import comm
from collective.embedding import masking
from collective.embedding.hash_table import step as policy_step
from collective.embedding.hash_table.growth import initial_row, never_marked, padded, shape_of_rows
from collective.embedding.hash_table.local_variables import plain_variable
from collective.embedding.hash_table.policy import VocabularyPolicy
from collective.embedding.table import shard_of

logger = logging.getLogger("collective.embedding")


RowMasks = Callable[[tf.Variable], Sequence[Tuple[tf.Tensor, tf.Variable]]]
"""``values -> [(current value, variable)]`` of per-row marks kept beside a table (the incremental-checkpoint
mask, SOK's update times): an eviction moves them with the rows. Built inside the eviction run, so the values
are read only then."""

HISTOGRAM_BUCKETS = 1024
"""LRU ages and LFU counts are told apart up to this value; larger ones share the last bucket."""


def _scatter(var: tf.Variable, indices: tf.Tensor, updates: tf.Tensor) -> tf.Operation:
    return tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=indices, updates=updates)


class DynamicVocabulary:
    """The policy's state and ops of one :class:`~.index.HashTable` (``index.dynamic``)."""

    def __init__(self, index, policy: VocabularyPolicy, collections: List[str]):
        self.index = index
        self.policy = policy.check(index.name, index.dim)
        self.slots: List[Tuple[tf.Variable, np.ndarray]] = []
        zeros = tf.compat.v1.zeros_initializer()
        self.usage = index.row_variable("usage", [2], tf.int64, collections)
        # The keys held at the last committed checkpoint: a delta's tombstones are those no longer held.
        self.saved_keys = index.row_variable("saved_keys", [], tf.int64, collections)
        self.saved_count = plain_variable("saved_count", [], tf.int64, zeros, collections)
        self.counter = None  # an index of the same class as ``index``
        self.counter_usage = self.dropped = None
        if not policy.admits_on_first_sight:
            capacity = int(policy.counter_capacity or index.capacity)
            initial = min(capacity, index.growth.sizes[0]) if index.growth is not None else None
            self.counter = type(index)(index.name + "/admission", 1, capacity, None, tf.float32, index.load_factor,
                                     index_scope="admission", initial_capacity=initial)
            with tf.compat.v1.variable_scope("admission"):
                self.counter_usage = self.counter.row_variable("usage", [2], tf.int64, collections)
                self.dropped = plain_variable("dropped", [], tf.int64, zeros, collections)

    @property
    def variables(self) -> List[tf.Variable]:
        """The policy's per-worker state variables."""
        own = [self.usage, self.saved_keys, self.saved_count]
        if self.counter is None:
            return own
        return own + [self.counter_usage, self.dropped] + self.counter.variables

    def default_vectors(self, count: tf.Tensor) -> tf.Tensor:
        row = tf.constant(self.policy.default_row(self.index.dim), self.index.dtype)
        return tf.tile(row[None, :], tf.stack([count, 1]))

    # ------------------------------------------------------------ lookups

    def owned_vectors(self, values: tf.Variable, keys: tf.Tensor, training: bool) -> tf.Tensor:
        """Vectors of the keys this worker owns; training lookups count, admit and insert them."""
        index = self.index
        keys = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        found = tf.unique_with_counts(keys, out_idx=tf.int64)  # not Unique: see exchanges.base.distinct
        distinct, position = found.y, found.idx
        if not training:
            return tf.gather(self._vectors(values, index.find(distinct)), position)
        with tf.control_dependencies(index._after_previous_insert()):  # pylint: disable=protected-access
            distinct = tf.identity(distinct)
        step = policy_step.value(index.name)
        rows = index.find(distinct)
        missing = rows < 0
        candidates = masking.select(distinct, missing)
        if self.counter is None:
            admitted = tf.ones_like(candidates, tf.bool)
            counts = tf.ones_like(candidates)
        else:
            admitted, counts = self._count(candidates, step)
        new_keys = masking.select(candidates, admitted)
        new_rows = index.append(new_keys)
        init = _scatter(values, new_rows, index.initial_values(new_keys))
        held = masking.select(rows, tf.logical_not(missing))
        seen = tf.gather(self.usage, held)[:, 0] + 1
        usage_rows = tf.concat([held, new_rows], axis=0)
        usage_values = tf.stack([tf.concat([seen, masking.select(counts, admitted)], axis=0),
                                 tf.fill(tf.shape(usage_rows), step)], axis=1)
        with tf.control_dependencies([seen]):
            used = _scatter(self.usage, usage_rows, usage_values)
        at = masking.select(tf.where(missing), admitted)
        rows = tf.tensor_scatter_nd_update(rows, at, new_rows)
        with tf.control_dependencies([init, used]):
            rows = tf.identity(rows)
        index._remember_insert(rows)  # pylint: disable=protected-access
        return tf.gather(self._vectors(values, rows), position)

    def _vectors(self, values: tf.Variable, rows: tf.Tensor) -> tf.Tensor:
        """``values`` at ``rows`` (gradient to those rows only), ``default_value`` where a row is -1."""
        held = rows >= 0
        at = tf.where(held)
        vectors = tf.gather(values, tf.gather_nd(rows, at))
        out = tf.scatter_nd(at, vectors, tf.stack([tf.size(rows, out_type=tf.int64), self.index.dim]))
        return tf.where(held[:, None], out, self.default_vectors(tf.size(rows)))

    def _count(self, keys: tf.Tensor, step: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """Counts distinct keys without a row in the counter table: ``(admitted now, count)`` per key.

        An admitted key's count restarts at 0 (it is purged at the next
        eviction run); a key the full counter table cannot take is not counted.
        """
        counter = self.counter
        rows = counter.find(keys)
        absent = rows < 0
        new_rows = counter.append(masking.select(keys, absent), partial=True)
        rows = tf.tensor_scatter_nd_update(rows, tf.where(absent), new_rows)
        fits = rows >= 0
        kept = masking.select(rows, fits)
        counts = tf.gather(self.counter_usage, kept)[:, 0] + 1
        admit = counts >= self.policy.min_count
        stored = tf.stack([tf.where(admit, tf.zeros_like(counts), counts), tf.fill(tf.shape(counts), step)], axis=1)
        with tf.control_dependencies([counts]):
            updates = [_scatter(self.counter_usage, kept, stored),
                       self.dropped.assign_add(tf.reduce_sum(tf.cast(tf.logical_not(fits), tf.int64)),
                                               read_value=False)]
        counts = tf.scatter_nd(tf.where(fits), counts, tf.shape(keys, out_type=tf.int64))
        with tf.control_dependencies(updates):
            return counts >= self.policy.min_count, tf.identity(counts)

    # ------------------------------------------------------------ eviction

    def remember_slot(self, slot: tf.Variable) -> None:
        """Registers an optimizer slot of the table: eviction moves and resets its rows with the values'."""
        if any(s is slot for s, _ in self.slots):
            return
        rows = None if self.index.growth is not None else self.index.capacity
        if slot.shape.rank is None or slot.shape[0] != rows:
            raise ValueError(f"hash table {self.index.name}: optimizer slot {slot.name} of shape {slot.shape} is not "
                             "one row per key; vocabulary policies cannot move its rows")
        self.slots.append((slot, initial_row(slot, self.index.name)))

    @property
    def runs_at_intervals(self) -> bool:
        """Whether an eviction run follows the table's updates every ``evict_every_steps`` steps."""
        return self.policy.evict_every_steps is not None and (self.policy.evicts or self.counter is not None)

    def upkeep(self, values: tf.Variable, step: tf.Tensor,
               row_masks: Optional[RowMasks] = None) -> Optional[tf.Operation]:
        """The eviction run after an update (``step``: the step after it): a no-op unless ``step`` is due.

        Built for every update op of the table (a second train op, another optimizer), each after its own update.
        """
        every = self.policy.evict_every_steps
        if not self.runs_at_intervals:
            return None
        due = tf.logical_and(step > 0, tf.equal(step % int(every), 0))

        def run():
            with tf.control_dependencies(self.evict(values, step, row_masks)):
                return tf.constant(True)

        return tf.cond(due, run, lambda: tf.constant(False), name="evict_" + values.op.name.replace("/", "_")).op

    def evict_now(self, row_masks: Optional[RowMasks] = None) -> tf.Operation:
        """An eviction run at the policy's step now (a checkpoint's: every worker runs it at the same step)."""
        values = self.index.values
        return tf.group(*self.evict(values, policy_step.value(self.index.name, create=False), row_masks),
                        name="evict_at_checkpoint_" + values.op.name.replace("/", "_"))

    def keep_mask(self, values: tf.Variable, keys: tf.Tensor, rows: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """Which held keys (``rows``) stay at eviction step ``step``."""
        policy = self.policy
        usage = tf.gather(self.usage, rows)
        keep = tf.ones_like(keys, tf.bool)
        if policy.steps_to_live is not None:
            keep = tf.logical_and(keep, step - usage[:, 1] <= int(policy.steps_to_live))
        if policy.l2_weight_threshold is not None:
            norms = tf.norm(tf.cast(tf.gather(values, rows), tf.float64), axis=1)
            keep = tf.logical_and(keep, norms >= float(policy.l2_weight_threshold))
        if policy.evict_strategy is not None:
            keep = tf.logical_and(keep, self._full_rule(usage, keep, step))
        return keep

    def _full_rule(self, usage: tf.Tensor, keep: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        """LRU / LFU: one threshold on age / count for all workers, from the summed histogram (one allreduce)."""
        policy, buckets = self.policy, HISTOGRAM_BUCKETS
        lru = policy.evict_strategy == "lru"
        value = tf.clip_by_value(step - usage[:, 1] if lru else usage[:, 0], 0, buckets - 1)
        ones = tf.cast(keep, tf.int64)
        histogram = comm.allreduce(tf.math.unsorted_segment_sum(ones, value, buckets), "sum")
        world = self.index.capacity * comm.world_size()
        total = tf.reduce_sum(histogram)
        target = int(policy.fill_after_evict * world)
        over = total > int(policy.max_fill * world)
        if lru:  # keep ages < a: the largest a in 1..B whose keys fit the target, at least a = 2: a run follows
            # an update, so the keys of the step just trained are 1 step old, and they all stay
            kept = tf.cumsum(histogram)  # kept[a - 1]: keys younger than a
            limit = tf.maximum(tf.reduce_sum(tf.cast(kept <= target, tf.int64)), 2)
            stays = value < limit
        else:  # keep counts >= c: the smallest c whose keys fit the target (at most the last bucket)
            kept = tf.cumsum(histogram, reverse=True)  # kept[c]: keys seen at least c times
            limit = tf.minimum(buckets - tf.reduce_sum(tf.cast(kept <= target, tf.int64)), buckets - 1)
            stays = value >= limit
        return tf.logical_or(tf.logical_not(over), stays)

    def evict(self, values: tf.Variable, step: tf.Tensor, row_masks: Optional[RowMasks] = None) -> List[tf.Operation]:
        """Ops evicting at ``step``: survivors move to rows ``0 .. K-1``, freed rows reset, index rebuilt."""
        keys, rows = self.index.entries()
        ops = self._keep_only(values, keys, rows, self.keep_mask(values, keys, rows, step), row_masks)
        if self.counter is not None:
            ops += self._purge_counter(step)
        return ops

    def remove(self, keys: tf.Tensor, row_masks: Optional[RowMasks] = None) -> tf.Operation:
        """Drops ``keys`` (those held) from the table, as an eviction does (a delta's tombstones)."""
        index = self.index
        held_keys, rows = index.entries()
        found = index.find(keys)
        found = masking.select(found, found >= 0)
        dropped = tf.scatter_nd(found[:, None], tf.ones_like(found, tf.bool), [index.allocated()])
        return tf.group(*self._keep_only(index.values, held_keys, rows, tf.logical_not(tf.gather(dropped, rows)),
                                         row_masks))

    def _keep_only(self, values: tf.Variable, keys: tf.Tensor, rows: tf.Tensor, keep: tf.Tensor,
                   row_masks: Optional[RowMasks]) -> List[tf.Operation]:
        """Ops keeping the held ``keys`` (at ``rows``) where ``keep``: compacted, freed rows reset, index rebuilt."""
        index = self.index
        survivors = masking.select(rows, keep)
        moved = [(values, np.zeros([index.dim], values.dtype.as_numpy_dtype)),
                 (self.usage, np.zeros([2], np.int64))] + self.slots
        ops = [_compact(var, survivors, row, index.rows_of(var)) for var, row in moved]
        for current, mask in (row_masks(values) if row_masks is not None else []):
            never = tf.constant(never_marked(mask.dtype), mask.dtype.base_dtype)
            if index.growth is None:
                freed = tf.fill([index.capacity - tf.size(survivors)], never)
            else:  # a mask not marked since the table grew is first padded to the index's rows
                with tf.control_dependencies([current]):
                    have = shape_of_rows(mask)
                rows = tf.maximum(have, index.allocated())
                current = padded(current, have, rows, np.array(never_marked(mask.dtype)))
                freed = tf.fill([rows - tf.size(survivors, out_type=tf.int64)], never)
            ops.append(tf.raw_ops.AssignVariableOp(resource=mask.handle, value=tf.concat(
                [tf.gather(current, survivors), freed], axis=0)))
        ops.append(index.rebuild(masking.select(keys, keep), tf.range(tf.size(survivors, out_type=tf.int64))))
        return ops

    # ------------------------------------------------------------ checkpoints

    def snapshot(self) -> tf.Operation:
        """Remembers the keys held now (run once a checkpoint is committed or restored)."""
        keys, _ = self.index.entries()
        count = tf.size(keys, out_type=tf.int64)
        rest = self.index.rows_of(self.saved_keys) - count
        return tf.group(self.saved_keys.assign(tf.concat([keys, tf.zeros([rest], tf.int64)], 0), read_value=False),
                        self.saved_count.assign(count, read_value=False))

    def assume_seen(self) -> tf.Tensor:
        """Gives every held key the usage of a key admitted now: ``(max(min_count, 1), step)``; returns the step.

        For rows restored from a checkpoint written without a policy (no
        counts or last-seen steps are stored): run after the restore of the step.
        """
        _, rows = self.index.entries()
        step = policy_step.value(self.index.name, create=False)
        count = tf.fill(tf.shape(rows), tf.constant(max(int(self.policy.min_count), 1), tf.int64))
        with tf.control_dependencies([_scatter(self.usage, rows, tf.stack([count, tf.fill(tf.shape(rows), step)], 1))]):
            return tf.identity(step)

    def tombstones(self) -> tf.Tensor:
        """Keys held at the last snapshot and not now (evicted since): a delta writes them so a restore drops them."""
        saved = self.saved_keys[:self.saved_count.read_value()]
        return masking.select(saved, self.index.find(saved) < 0)

    def _purge_counter(self, step: tf.Tensor) -> List[tf.Operation]:
        """Drops admitted keys (count 0) and, with a steps-to-live, keys not seen for longer from the counter."""
        counter, ttl = self.counter, self.policy.counter_ttl
        keys, rows = counter.entries()
        usage = tf.gather(self.counter_usage, rows)
        keep = usage[:, 0] > 0
        if ttl is not None:
            keep = tf.logical_and(keep, step - usage[:, 1] <= int(ttl))
        survivors = masking.select(rows, keep)
        return [_compact(self.counter_usage, survivors, np.zeros([2], np.int64), counter.rows_of(self.counter_usage)),
                counter.rebuild(masking.select(keys, keep), tf.range(tf.size(survivors, out_type=tf.int64)))]


def _compact(var: tf.Variable, survivors: tf.Tensor, row: np.ndarray, capacity) -> tf.Operation:
    """``var``'s rows ``survivors`` moved to ``0 .. K-1``; the other rows (up to ``capacity``) set to ``row``."""
    moved = tf.gather(var, survivors)
    if tf.is_tensor(capacity):  # a growing table's rows now
        capacity = tf.cast(capacity, tf.int32)
    rest = tf.broadcast_to(tf.constant(row, var.dtype.base_dtype),
                           tf.concat([[capacity - tf.size(survivors)], tf.shape(moved)[1:]], axis=0))
    return var.assign(tf.concat([moved, rest], axis=0), read_value=False)


def remember_slot(slot: tf.Variable, table: tf.Variable) -> tf.Variable:
    """A ``watch_slots`` listener: a slot of a table with a policy is registered with it."""
    info = shard_of(table)
    dynamic = getattr(info.hash_index, "dynamic", None) if info is not None else None
    if dynamic is not None and slot is not table:
        dynamic.remember_slot(slot)
    return slot


def upkeep_ops(pairs, after, row_masks: Optional[RowMasks] = None, optimizer=None,
               global_step=None) -> List[tf.Operation]:
    """After ``optimizer``'s update (``after``) of ``(gradient, variable)`` pairs: the policy tables' step moved
    (:func:`.step.after_update`) and their eviction runs when due."""
    if tf.executing_eagerly():
        return []
    found = []
    for grad, var in pairs:
        info = shard_of(var)
        dynamic = getattr(info.hash_index, "dynamic", None) if info is not None and grad is not None else None
        if dynamic is not None and dynamic.index.values is var:
            found.append((dynamic, var))
    if not found:
        return []
    interval = [d for d, _ in found if d.runs_at_intervals]
    named = (interval or [found[0][0]])[0].index.name
    step = policy_step.after_update(optimizer, named, after, global_step, interval=bool(interval))
    ops = [step.op]
    for dynamic, var in found:
        op = dynamic.upkeep(var, step, row_masks)
        if op is not None:
            ops.append(op)
    return ops
