"""A sharded table as one logical table: the rows a worker holds, gathered; the rows it owns, assigned.

Both persistence stacks stand on it: :class:`collective.checkpoint.Saver`
(:mod:`.layout`, :mod:`.hash_tables`) and SOK's dumps and Keras checkpoints
(:mod:`collective.sok`), which add only their file formats and names. A
table is its values variable; each optimizer slot shaped like it has the
same rows. A table with a hash-table vocabulary (``ShardInfo.hash_index``)
holds keys at the local rows its index gives them.

- :func:`held_rows` / :func:`held_values`: the keys this worker holds and their rows;
- :func:`gather_on_rank0`: the whole logical table (or chosen rows), keys ascending, on worker 0 (a collective);
- :func:`keep_owned`: of restored keys and rows, those this worker owns under its world size;
- :func:`assign_owned`: writes owned rows into the shards (a hash table's index is refilled, or only updated);
- :func:`insert_rows`: inserts keys into a hash index and writes their rows;
- :func:`assign_slot_rows`: a hash table's slot: rows at the index's rows of the keys, the rest reset.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from collective import comm
from collective.embedding import masking
from collective.embedding.layout import ShardLayout
from collective.embedding.table import ShardInfo


def held_rows(info: ShardInfo) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """The logical keys this worker holds and, for a hash table, their local rows (None: local row ``i`` in order)."""
    if info.hash_index is None:
        return info.layout.global_row(tf.range(info.local_rows, dtype=tf.int64)), None
    return info.hash_index.entries()


def held_values(table: tf.Variable, rows: Optional[tf.Tensor]) -> tf.Tensor:
    """The rows of ``table`` (the values variable or a slot) that :func:`held_rows` gave, in its order."""
    return tf.convert_to_tensor(table) if rows is None else tf.gather(table, rows)


def gather_on_rank0(info: ShardInfo, tables: Sequence[tf.Variable],
                    selected: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    """``(keys, [rows of each of tables])`` of the whole logical table on worker 0, keys ascending.

    ``tables`` share ``info``'s rows (the values variable, its slots). The
    other workers get no rows. ``selected`` (bool per local row) keeps only
    those rows of every worker. A collective: every worker calls it, for the
    same tables in the same order.
    """
    keys, rows = held_rows(info)
    if selected is not None:
        rows = tf.range(info.local_rows, dtype=tf.int64) if rows is None else rows
        keep = tf.gather(selected, rows)
        keys, rows = masking.select(keys, keep), masking.select(rows, keep)
    keys = _to_rank0(keys)
    order = tf.argsort(keys)
    return tf.gather(keys, order), [tf.gather(_to_rank0(held_values(t, rows)), order) for t in tables]


def _to_rank0(tensor: tf.Tensor) -> tf.Tensor:
    """Every worker's rows of ``tensor``, concatenated in rank order, on worker 0 (one alltoall)."""
    n = comm.world_size()
    if n == 1:
        return tensor
    count = tf.shape(tensor)[:1]
    return comm.alltoall(tensor, tf.concat([count, tf.zeros([n - 1], tf.int32)], axis=0))[0]


def keep_owned(layout: ShardLayout, keys: tf.Tensor,
               values: Sequence[tf.Tensor]) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    """The ``keys`` (and their rows of each of ``values``) that ``layout``'s worker owns."""
    mine = layout.owns(keys)
    return masking.select(keys, mine), [masking.select(v, mine) for v in values]


def assign_owned(tables: Sequence[tf.Variable], info: ShardInfo, keys: tf.Tensor,
                 values: Sequence[tf.Tensor], update_only: Union[bool, tf.Tensor] = False,
                 fresh: Sequence[Tuple[tf.Variable, object]] = ()) -> tf.Operation:
    """Writes this worker's ``keys`` (which it owns) with one ``[keys, dim]`` tensor of ``values`` per table.

    ``tables`` is the values variable (and its slots). A table without a hash
    table writes those rows and keeps the others; a hash table's index is
    emptied and then holds exactly ``keys``, or with ``update_only`` (a bool,
    or a bool tensor in a graph) keeps its other keys and inserts or updates
    ``keys``. ``fresh``: ``(per-row variable, the row it starts with)`` of a
    hash table, every row of which is reset when the index is emptied (so a
    key inserted later finds no state of a key held before). Eagerly it has
    run on return.
    """
    keys = tf.reshape(keys, [-1])
    values = [tf.reshape(v, [-1, info.dim]) for v in values]
    index = info.hash_index
    if index is None:
        local = info.layout.local_row(keys)
        return tf.group(*[t.scatter_update(tf.IndexedSlices(v, local)) for t, v in zip(tables, values)])
    def empty():
        return tf.group(index.clear(), *[reset_rows(var, row) for var, row in fresh])

    if tf.executing_eagerly():
        if not bool(update_only):
            empty()
        return insert_rows(index, list(tables), keys, values)
    if isinstance(update_only, bool):
        cleared = [] if update_only else [empty()]
    else:  # known when the graph runs

        def clear():
            with tf.control_dependencies([empty()]):
                return tf.constant(True)

        cleared = [tf.cond(update_only, lambda: tf.constant(True), clear)]
    with tf.control_dependencies(cleared):
        return insert_rows(index, list(tables), keys, values)


def reset_rows(var: tf.Variable, row) -> tf.Operation:
    """Sets every row of per-row ``var`` (as many rows as it holds now) to ``row``."""
    held = tf.raw_ops.VariableShape(input=var.handle, out_type=tf.int64)
    return var.assign(tf.broadcast_to(tf.cast(row, var.dtype.base_dtype), held), read_value=False)


def insert_rows(index, variables: Sequence[tf.Variable], keys: tf.Tensor, values: Sequence[tf.Tensor]) -> tf.Operation:
    """Inserts ``keys`` (owned by this worker) into ``index`` and writes their rows of each of ``variables``.

    ``values`` holds one ``[keys, dim]`` tensor per variable. The index orders
    inserts built in one graph after each other; a restore must not wait for
    a training lookup's insert (it would need the model's inputs), so this one
    is built outside that chain.
    """
    last_insert, index._last_insert = index._last_insert, None  # pylint: disable=protected-access
    rows = index.find_or_insert(keys)
    index._last_insert = last_insert  # pylint: disable=protected-access
    with tf.control_dependencies([rows]):  # a growing table's slots grow to the rows the insert may have added
        grown = [op for op in (index.catch_up(v) for v in variables) if op is not None]
    with tf.control_dependencies(grown):
        return tf.group(*[v.scatter_update(tf.IndexedSlices(vals, rows)) for v, vals in zip(variables, values)])


def assign_slot_rows(slot: tf.Variable, index, keys: tf.Tensor, values: tf.Tensor, initial: tf.Tensor,
                     after: Optional[tf.Operation] = None) -> tf.Operation:
    """Sets every row of ``slot`` to ``initial``, then ``values`` at the rows ``index`` holds ``keys`` at.

    ``after``: the op that refilled the index (a graph's restore of the table);
    keys the index does not hold are skipped.
    """
    with tf.control_dependencies([after] if after is not None else []):
        rows = index.find(keys)
        held = rows >= 0
        shape = tf.shape(slot)
        if getattr(index, "growth", None) is not None:  # as many rows as the index has grown to, at least
            shape = tf.raw_ops.VariableShape(input=slot.handle, out_type=tf.int64)
            shape = tf.concat([[tf.maximum(shape[0], index.allocated())], shape[1:]], axis=0)
        reset = slot.assign(tf.broadcast_to(tf.cast(initial, slot.dtype), shape), read_value=False)
    with tf.control_dependencies([reset] if reset is not None else []):
        return slot.scatter_update(tf.IndexedSlices(masking.select(values, held), masking.select(rows, held)))
