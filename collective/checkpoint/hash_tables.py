"""Checkpoints of hash-table vocabularies: keys plus their rows, whatever the world size.

A hash table ``<name>`` is stored as ``<name>/keys`` ``[K]`` int64, ``<name>``
``[K, dim]`` and each optimizer slot ``[K, dim]`` (with a vocabulary policy
also ``<name>/hash_index/usage`` ``[K, 2]``: count and last-seen step, and
the counter table as ``<name>/admission/keys`` with its
``<name>/hash_index/admission/usage``), all in the same key order:
worker 0's keys (by local row), then worker 1's, ... Each worker
writes its ``count`` rows as slices at the offset an allgather of counts
gives, into its own part (no part when it holds no key: a slice cannot be
empty); rank 0 stores the counts' bounds under
``_collective/row_splits/<name>``. Restoring under ``M`` workers clears the
index, then reads the stored blocks one at a time, keeps the keys with
``floormod(key, M) == rank``, inserts them and writes their values and slot
rows at the rows the index hands out.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import layout, logical
from collective.checkpoint.model_dir import checkpoint_key
from collective.embedding.layout import ShardLayout
from collective.embedding.table import shard_of
from collective.sharding.layouts.table_wise import TableWiseLayout
from collective.tf_internals import io_ops


def keys_key(name: str) -> str:
    """The checkpoint key of a hash table's keys."""
    return f"{name}/keys"


@dataclasses.dataclass
class HashFamily:
    """One hash table: its values variable, its slots and the ops that save and restore them."""

    index: object
    variables: List[tf.Variable]  # values first, then slots
    name: str = ""
    row_splits: tf.Tensor = None
    save: tf.Operation = None
    restore_init: tf.Operation = None
    restore_block: tf.Operation = None
    block_feed: Dict[str, tf.Tensor] = dataclasses.field(default_factory=dict)
    # A table with a policy: the restore of a checkpoint written without one (rows and slots, no usage).
    unpoliced: "Optional[Unpoliced]" = None
    # A policy's counter table: per-worker state that no touched mask follows, so every delta holds all of it.
    whole_in_deltas: bool = False


@dataclasses.dataclass
class Unpoliced:
    """Restoring a policy table from a checkpoint written without a policy: no ``usage`` is stored.

    ``restore_block`` reads one block of the rows and slots; once all are in,
    ``assume`` (fetch it) gives every held key the usage its admission would
    have and returns the step it assumed.
    """

    usage_key: str
    restore_block: tf.Operation
    block_feed: Dict[str, tf.Tensor]
    assume: tf.Tensor
    min_count: int


def build_unpoliced(index, variables: List[tf.Variable], name: str, prefix: tf.Tensor,
                    owner: ShardLayout) -> Optional[Unpoliced]:
    """The :class:`Unpoliced` restore of a table whose last variable is its policy's usage (else None)."""
    dynamic = getattr(index, "dynamic", None)
    if dynamic is None or variables[-1] is not dynamic.usage:
        return None
    rows_and_slots = variables[:-1]
    keys, values, feed = read_keyed(prefix, name, rows_and_slots, owner, [checkpoint_key(v) for v in rows_and_slots])
    return Unpoliced(checkpoint_key(dynamic.usage), logical.insert_rows(index, rows_and_slots, keys, values), feed,
                     dynamic.assume_seen(), int(dynamic.policy.min_count))


def lacks_usage(unpoliced: Optional[Unpoliced], reader, name: str) -> bool:
    """Whether the checkpoint ``reader`` reads holds rows of table ``name`` but not the policy's usage of them."""
    return unpoliced is not None and reader.has_tensor(keys_key(name)) and not reader.has_tensor(unpoliced.usage_key)


def build_checkpoint_eviction(found: List["HashFamily"], row_masks) -> Optional[tf.Operation]:
    """One op running the eviction of every table among ``found`` whose policy evicts at checkpoints (or None)."""
    ops = []
    for family in found:
        dynamic = getattr(family.index, "dynamic", None)
        if dynamic is None or not dynamic.policy.evict_at_checkpoint:
            continue
        for slot in family.variables[1:]:  # the saved slots move with the rows, whoever made them
            if slot is not dynamic.usage:
                dynamic.remember_slot(slot)
        ops.append(dynamic.evict_now(row_masks))
    return tf.group(*ops, name="evict_at_checkpoint") if ops else None


def families(sharded: List[tf.Variable]) -> List[HashFamily]:
    """The hash tables among ``sharded``, their values variable first (slots follow it)."""
    found: Dict[int, HashFamily] = {}
    for var in sharded:
        index = shard_of(var).hash_index
        if index is None:
            continue
        family = found.setdefault(id(index), HashFamily(index, []))
        family.variables.append(var)
    for family in found.values():
        values = [v for v in family.variables if checkpoint_key(v) == family.index.name]
        if not values:
            raise ValueError(f"hash table {family.index.name}: the checkpoint's var_list holds its optimizer "
                             "slots but not its values variable; save the table with its slots")
        family.variables.sort(key=lambda v: (v is not values[0], checkpoint_key(v)))
        family.name = checkpoint_key(values[0])
    result = list(found.values())
    for family in list(result):
        dynamic = getattr(family.index, "dynamic", None)
        if dynamic is None:
            continue
        family.variables.append(dynamic.usage)  # each key's count and last-seen step, as a [K, 2] column
        if dynamic.counter is not None:  # the counter table: keys not admitted yet, with their counts
            result.append(HashFamily(dynamic.counter, [dynamic.counter_usage], counter_key(family.name),
                                     whole_in_deltas=True))
    return result


def counter_key(name: str) -> str:
    """The checkpoint name of hash table ``name``'s counter table (``<it>/keys`` and ``<it>/usage``)."""
    return f"{name}/admission"


def build_save(family: HashFamily, part_prefix: tf.Tensor) -> None:
    """Adds this worker's save of ``family`` (a no-op when it holds no key) and the row bounds."""
    keys, rows = family.index.entries()
    family.save, family.row_splits = write_keyed(
        part_prefix, family.name, [checkpoint_key(v) for v in family.variables], keys,
        rows_of_each(family.index, family.variables, rows))


def rows_of_each(index, variables: Sequence[tf.Variable], rows: tf.Tensor) -> List[tf.Tensor]:
    """``rows`` of each of ``variables`` (values, slots, usage) of the hash table ``index``, for a save.

    A growing table's slots reach its allocation only right before their own
    update, so a save that comes between a lookup that grew the table and that
    update first catches them up.
    """
    grown = [op for op in (index.catch_up(v) for v in variables) if op is not None]
    with tf.control_dependencies(grown):
        return [logical.held_values(v, rows) for v in variables]


def write_keyed(part_prefix: tf.Tensor, name: str, names: List[str], keys: tf.Tensor,
                tensors: List[tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
    """This worker's rows of one keyed table (``<name>/keys`` and one ``[K, dim]`` tensor per ``names``).

    Each worker writes its ``count`` rows as slices at the offset an
    allgather of the counts gives (a collective), into its own part; no part
    when it holds no row (a slice cannot be empty). Returns ``(whether this
    worker wrote a part, the row bounds [workers + 1])``.
    """
    count = tf.size(keys, out_type=tf.int64)
    counts = comm.allgather(tf.reshape(count, [1]))
    row_splits = tf.concat([[0], tf.cumsum(counts)], axis=0)
    offset = row_splits[comm.rank()]
    total = row_splits[-1]
    specs = [layout.slice_spec([total], offset, count)] + [
        layout.slice_spec([total, int(t.shape[1])], offset, count) for t in tensors]

    def write():
        with tf.control_dependencies([io_ops.save_v2(part_prefix, [keys_key(name)] + list(names), tf.stack(specs),
                                                     [keys] + list(tensors))]):
            return tf.constant(True)

    return tf.cond(count > 0, write, lambda: tf.constant(False)), row_splits


def read_keyed(prefix: tf.Tensor, name: str, variables: List[tf.Variable], owner: ShardLayout,
               names: List[str]) -> Tuple[tf.Tensor, List[tf.Tensor], Dict[str, tf.Tensor]]:
    """One stored block of a keyed table: the keys ``owner`` owns and their rows of each of ``variables``.

    Returns ``(keys, [rows per variable], feed)``; ``feed`` holds the
    placeholders ``lo``, ``hi`` (the block) and ``total`` (stored keys).
    """
    lo = tf.compat.v1.placeholder(tf.int64, [], name="block_start")
    hi = tf.compat.v1.placeholder(tf.int64, [], name="block_end")
    total = tf.compat.v1.placeholder(tf.int64, [], name="keys_total")
    specs = [layout.slice_spec([total], lo, hi - lo)] + [
        layout.slice_spec([total, int(v.shape[1])], lo, hi - lo) for v in variables]
    stored = io_ops.restore_v2(prefix, [keys_key(name)] + list(names), tf.stack(specs),
                               [tf.int64] + [v.dtype.base_dtype for v in variables])
    keys, values = logical.keep_owned(owner, tf.reshape(stored[0], [-1]), [
        tf.reshape(rows, [-1, int(v.shape[1])]) for v, rows in zip(variables, stored[1:])])
    return keys, values, {"lo": lo, "hi": hi, "total": total}


def run_blocks(sess, op: tf.Operation, feed: Dict[str, tf.Tensor], prefix_tensor: tf.Tensor, prefix: str,
               splits: np.ndarray) -> None:
    """Runs ``op`` (built on :func:`read_keyed`) once per stored block (``splits``: stored row bounds)."""
    bounds = np.unique(np.asarray(splits, np.int64))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        sess.run(op, {prefix_tensor: prefix, feed["lo"]: lo, feed["hi"]: hi, feed["total"]: bounds[-1]})


def build_restore(family: HashFamily, prefix: tf.Tensor, rank: int, world_size: int) -> None:
    """Adds the ops restoring ``family``: clear (run once), then one run per stored block."""
    index, variables = family.index, family.variables
    # Rows not restored keep their initial values: a key inserted later finds its slot rows as at the start.
    family.restore_init = tf.group(index.clear(), *[v.initializer for v in variables])
    owner = key_owner(variables[0], rank, world_size)
    keys, values, family.block_feed = read_keyed(prefix, family.name, variables, owner,
                                                 [checkpoint_key(v) for v in variables])
    family.restore_block = logical.insert_rows(index, variables, keys, values)
    family.unpoliced = build_unpoliced(index, variables, family.name, prefix, owner)


def key_owner(values: tf.Variable, rank: int, world_size: int):
    """Which keys of the hash table ``values`` rank ``rank`` of ``world_size`` owns: ``floormod(key, N) == rank``,
    or every key on the holder of a table-wise table (its plan, not the checkpoint's, decides)."""
    info = shard_of(values)
    if info is None or info.holder is None:
        return ShardLayout(rank, world_size)
    return TableWiseLayout(rank, world_size, info.holder)


def restore(sess, family: HashFamily, prefix: str, prefix_tensor: tf.Tensor, splits: np.ndarray,
            reader=None) -> bool:
    """Clears the index and inserts this worker's keys block by block (``splits``: stored row bounds).

    Returns True when the checkpoint (read by ``reader``) holds the table's
    rows without the usage its policy keeps (written without a policy): then
    the rows and slots are restored, and the caller runs ``family.unpoliced.assume``.
    """
    sess.run(family.restore_init)
    if reader is not None and lacks_usage(family.unpoliced, reader, family.name):
        run_blocks(sess, family.unpoliced.restore_block, family.unpoliced.block_feed, prefix_tensor, prefix, splits)
        return True
    run_blocks(sess, family.restore_block, family.block_feed, prefix_tensor, prefix, splits)
    return False
