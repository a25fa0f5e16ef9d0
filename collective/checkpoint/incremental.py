"""The graph side of incremental checkpoints: a delta holds each table's changed rows as keys plus rows.

A delta stores every sharded table the way a full checkpoint stores a
hash table (:mod:`.hash_tables`): ``<table>/keys`` ``[K]`` int64 (logical row
ids of a fixed table, keys of a hash table), ``<table>`` ``[K, dim]`` and each
optimizer slot ``[K, dim]`` in the same order, and the stored row bounds
under ``_collective/row_splits/<table>``. The rows are those
:mod:`.touched` marked since the last committed save, read on the worker
that owns them (each row has one owner, so each is written once; a table
held whole on every worker writes, on each, the marked rows of its own
contiguous block). Replicated variables (dense layers, ``global_step``,
optimizer counters) are written whole by rank 0, as in a full checkpoint.

Restoring a delta under any number of workers reads its blocks one at a
time, keeps the keys this worker owns and writes them over the rows
restored so far: a fixed table at their local rows, a hash table by
insert-or-update (new keys get rows, known keys are overwritten). A fixed
table the delta holds whole, without keys, was an ordinary variable where
the delta was written (fewer rows than workers); it is restored whole, its
rows this worker holds read as from a full checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional

import numpy as np
import tensorflow as tf

from collective.checkpoint import hash_tables, layout, logical, touched
from collective.checkpoint.model_dir import checkpoint_key
from collective.embedding import masking
from collective.embedding import tables as table_registry
from collective.embedding.table import ShardInfo, shard_of
from collective.sharding.plan import PlanError

TOMBSTONE_PART = "-tombstones"
"""Suffix of the part file a worker writes a table's tombstones into (beside its ``-delta<t>`` part)."""


@dataclasses.dataclass
class DeltaTable:
    """One table with its slots: what a delta writes for it and the ops that read it back."""

    name: str
    variables: List[tf.Variable]  # values first, then slots
    save: tf.Tensor = None
    row_splits: tf.Tensor = None
    rows: tf.Tensor = None
    restore_block: tf.Operation = None
    block_feed: Dict[str, tf.Tensor] = dataclasses.field(default_factory=dict)
    # A fixed table: its rows and slots read from a delta that holds them whole (see the module docstring).
    restore_whole: tf.Operation = None
    # A hash table with a vocabulary policy: the keys evicted since the last save (written, then removed on restore).
    tombstone_save: tf.Tensor = None
    tombstone_splits: tf.Tensor = None
    tombstone_restore: tf.Operation = None
    tombstone_feed: Dict[str, tf.Tensor] = dataclasses.field(default_factory=dict)
    # A hash table with a vocabulary policy, restored from a delta written without one.
    unpoliced: Optional[hash_tables.Unpoliced] = None

    @property
    def info(self) -> ShardInfo:
        return shard_of(self.variables[0])

    @property
    def dynamic(self):
        """The table's vocabulary policy state (:mod:`collective.embedding.hash_table.dynamic`), else None."""
        return getattr(self.info.hash_index, "dynamic", None)


def tombstones_key(name: str) -> str:
    """The name a delta stores table ``name``'s evicted keys under (``<it>/keys``)."""
    return f"{name}/tombstones"


def _table_of(var: tf.Variable) -> tf.Variable:
    owner = table_registry.slot_owner(var)
    table = var if owner is None else owner
    # The Saver's view of a packed table's rows and a variable derived from the table (an EMA shadow) are one
    # table's: the packed table.
    return getattr(table, "packed_table", table)


def group_tables(sharded: List[tf.Variable], names: Optional[Mapping[int, str]] = None) -> List[DeltaTable]:
    """The sharded variables grouped by table (values variable first, then its slots by name)."""
    found: Dict[int, DeltaTable] = {}
    order: List[int] = []
    for var in sharded:
        owner = _table_of(var)
        if id(owner) not in found:
            found[id(owner)] = DeltaTable(checkpoint_key(owner, names), [])
            order.append(id(owner))
        found[id(owner)].variables.append(var)
    result = []
    for key in order:
        table = found[key]
        values = [v for v in table.variables if table_registry.slot_owner(v) is None]
        if not values:
            raise ValueError(f"table {table.name}: the checkpoint's var_list holds its optimizer slots but not the "
                             "table; save the table with its slots")
        table.variables.sort(key=lambda v: (v is not values[0], checkpoint_key(v, names)))
        if table.dynamic is not None:
            table.variables.append(table.dynamic.usage)
        result.append(table)
    return result


def _changed(table: DeltaTable):
    """``(keys, local rows)`` of the rows of ``table`` this worker writes into a delta."""
    values = table.variables[0]
    info = table.info
    if info.hash_index is not None:
        keys, rows = info.hash_index.entries()
        marked = touched.marked_at(values, rows)
        return masking.select(keys, marked), masking.select(rows, marked)
    local = touched.touched_rows(values)
    keys = info.layout.global_row(local)
    if info.world_size > 1 and not info.layout.sharded:  # whole on every worker: each writes its own block
        bounds = layout.block_bounds(info.vocab, info.world_size)
        mine = (keys >= bounds[info.rank]) & (keys < bounds[info.rank + 1])
        return masking.select(keys, mine), masking.select(local, mine)
    return keys, local


def _check_deltas(table: DeltaTable) -> None:
    if table.info.column_wise:
        raise PlanError(f"table {table.name}: incremental checkpoints (deltas) of a column_wise table are not "
                        "built yet; place it row_wise, or save full checkpoints only")


def build_save(table: DeltaTable, part_prefix: tf.Tensor, names: Optional[Mapping[int, str]] = None) -> None:
    """Adds this worker's write of ``table``'s changed rows (a collective: every worker builds and runs it)."""
    _check_deltas(table)
    keys, rows = _changed(table)
    table.rows = tf.size(keys)
    index = table.info.hash_index
    rows_of_each = [tf.gather(v, rows) for v in table.variables] if index is None else \
        hash_tables.rows_of_each(index, table.variables, rows)
    table.save, table.row_splits = hash_tables.write_keyed(
        part_prefix, table.name, [checkpoint_key(v, names) for v in table.variables], keys, rows_of_each)
    if table.dynamic is not None:
        table.tombstone_save, table.tombstone_splits = hash_tables.write_keyed(
            tf.strings.join([part_prefix, TOMBSTONE_PART]), tombstones_key(table.name), [],
            table.dynamic.tombstones(), [])


def build_restore(table: DeltaTable, prefix: tf.Tensor, rank: int, world_size: int,
                  names: Optional[Mapping[int, str]] = None) -> None:
    """Adds the op writing one stored block of ``table`` from a delta over this worker's rows."""
    _check_deltas(table)
    info = table.info
    owner = info.layout if info.hash_index is None else hash_tables.key_owner(table.variables[0], rank, world_size)
    keys, values, table.block_feed = hash_tables.read_keyed(
        prefix, table.name, table.variables, owner, [checkpoint_key(v, names) for v in table.variables])
    if info.hash_index is None:
        table.restore_block = logical.assign_owned(table.variables, info, keys, values)
        table.restore_whole = _restore_whole(table, prefix, names)
    else:
        table.restore_block = logical.insert_rows(info.hash_index, table.variables, keys, values)
        table.unpoliced = hash_tables.build_unpoliced(info.hash_index, table.variables, table.name, prefix, owner)
    if table.dynamic is not None:
        gone, _, table.tombstone_feed = hash_tables.read_keyed(prefix, tombstones_key(table.name), [], owner, [])
        table.tombstone_restore = table.dynamic.remove(gone, touched_masks)


def _restore_whole(table: DeltaTable, prefix: tf.Tensor, names: Optional[Mapping[int, str]]) -> tf.Operation:
    """Assigns this worker's rows of ``table`` and its slots from a delta that holds them whole."""
    info = table.info
    whole = tf.constant([0, info.vocab], tf.int64)
    return tf.group(*[var.assign(layout.restore_rows(prefix, checkpoint_key(var, names), whole,
                                                     [info.vocab, info.dim], var.dtype.base_dtype, info.layout),
                                 read_value=False) for var in table.variables])


def stored_whole(reader, name: str) -> bool:
    """Whether the delta ``reader`` reads holds table ``name`` whole: written where it was an ordinary variable
    (fewer rows than workers), by rank 0 like a dense layer, with no ``<name>/keys``."""
    return reader.has_tensor(name) and not reader.has_tensor(hash_tables.keys_key(name))


def touched_masks(values: tf.Variable) -> List:
    """``[(value, variable)]`` of table ``values``'s per-row marks (mask, update times): an eviction moves them."""
    return touched.row_state(values)


def restore(sess, table: DeltaTable, prefix: str, prefix_tensor: tf.Tensor, splits: np.ndarray,
            tombstone_splits: Optional[np.ndarray] = None, reader=None) -> bool:
    """Writes ``table``'s rows stored in delta ``prefix`` over this worker's rows, block by block.

    A hash table with a policy first drops the keys the delta marks evicted
    (``tombstone_splits``: their stored bounds); keys written again later are then re-inserted.
    Returns True when the delta (read by ``reader``) holds a policy table's rows without their usage (written
    without a policy): rows and slots are restored, and the caller runs ``table.unpoliced.assume``. A fixed table
    the delta holds whole (:func:`stored_whole`) is restored from it whole.
    """
    if table.restore_whole is not None and reader is not None and stored_whole(reader, table.name):
        sess.run(table.restore_whole, {prefix_tensor: prefix})
        return False
    if table.tombstone_restore is not None and tombstone_splits is not None:
        hash_tables.run_blocks(sess, table.tombstone_restore, table.tombstone_feed, prefix_tensor, prefix,
                               tombstone_splits)
    if reader is not None and hash_tables.lacks_usage(table.unpoliced, reader, table.name):
        hash_tables.run_blocks(sess, table.unpoliced.restore_block, table.unpoliced.block_feed, prefix_tensor,
                               prefix, splits)
        return True
    hash_tables.run_blocks(sess, table.restore_block, table.block_feed, prefix_tensor, prefix, splits)
    return False
