"""Packing groups wired into the strategy (issue 44, stage 2, design B; docs/packing.md).

With packing on (``COLLECTIVE_PACKING=1``), a row-wise table that
``embedding_scope()``'s ``get_variable`` getter makes in a graph is a
:class:`~collective.embedding.packed_group.PackedTable` (:func:`table`),
not a variable: it is tagged with its own ``ShardInfo``, so lookups,
gradient norms and the plan see the table. The tables of one packing group
(same dim, dtype, world size; made in one graph) share one group variable,
``collective_packed/<first table>`` (:func:`group_name`), made when one of
them is first looked up (the *seal*: every table of the group made so far
joins; a table made after the seal opens the group's next variable).
Lookups gather the group variable at ``offset + local row``
(:func:`owned_rows`, one gather per group in :func:`rows_of_keys`).

The optimizer wrapper (:mod:`collective.integration.training`) splits the
group variable's gradient into the tables' (:func:`split_pairs`, so
clipping, summaries and global norms see the user's tables) and merges them
back before the optimizer applies them (:func:`merge_pairs`: one sparse
update, one set of slots per group). The Saver writes each table and each
slot under its unpacked name (:func:`expand_for_saving`).

Tables left unpacked (each still its own variable): hash tables, replicated,
table-wise and column-wise tables, tables with a regularizer or a
constraint, tables made by Keras (``add_weight``) or eagerly / in a
``tf.function``, and every table when exporting.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from typing import Callable, ContextManager, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from collective.embedding import lookup, modes, packing
from collective.embedding.packed_group import NamedOp, PackedGroup, PackedTable, row_range, write_rows
from collective.embedding.table import SHARDED_COLLECTION, ShardInfo, scoped_contract, shard_of
from collective.sharding import planner, shards
from collective.tf_internals import extending, func_graph, set_initializer

_GroupKey = Tuple[str, int, int]
PACKED_SCOPE = "collective_packed"
# Per graph: the tables made by name (get_variable returns the same object when asked again), the tables waiting
# for their group by group key, and how many variables each group key has made.
_made: "weakref.WeakKeyDictionary[tf.Graph, Dict[str, PackedTable]]" = weakref.WeakKeyDictionary()
_pending: "weakref.WeakKeyDictionary[tf.Graph, Dict[_GroupKey, List[PackedTable]]]" = weakref.WeakKeyDictionary()
_sealed: "weakref.WeakKeyDictionary[tf.Graph, Dict[_GroupKey, int]]" = weakref.WeakKeyDictionary()


def unpacked_reason(info: ShardInfo, kwargs: dict) -> Optional[str]:
    """Why a table made now by the getter stays its own variable; None when it packs."""
    if not packing.enabled():
        return "packing off (COLLECTIVE_PACKING=0)"
    if modes.is_exporting():
        return "exporting: plain variables"
    if tf.executing_eagerly() or isinstance(tf.compat.v1.get_default_graph(), func_graph.FuncGraph):
        return "made eagerly or in a tf.function"
    if not planner.packable(info.placement, lookup.current()) or info.hash_index is not None:
        return (f"placement {info.placement} under {lookup.current()}"
                f"{' (a hash table)' if info.hash_index is not None else ''}: packs row-wise fixed-vocabulary tables "
                "under hb only")
    if kwargs.get("regularizer") is not None or kwargs.get("constraint") is not None:
        return "a regularizer or constraint of its own"
    if kwargs.get("trainable") is False:
        return "not trainable"
    return None


def existing(name: str) -> Optional[PackedTable]:
    """The packed table the getter made as ``name`` in the current graph, if any."""
    if tf.executing_eagerly():
        return None
    return _made.get(tf.compat.v1.get_default_graph(), {}).get(name)


def table(name: str, info: ShardInfo, dtype: tf.DType, initial: Callable[[], tf.Tensor],
          making: Callable[[ShardInfo], ContextManager]) -> PackedTable:
    """A packed table ``name`` (this worker's rows of it, ``initial()`` their initial value), waiting for its
    group; ``making(info)`` is the block its group variable is made in (the getter's: a shard, not broadcast)."""
    graph = tf.compat.v1.get_default_graph()
    made = _made.setdefault(graph, {})
    if name in made:
        return made[name]
    packed = PackedTable(name, info.local_rows, info.local_dim, dtype.base_dtype,
                         info=scoped_contract(dataclasses.replace(info, name=name)), initial=initial, seal=_seal)
    made[name] = packed
    key = (dtype.base_dtype.name, info.local_dim, info.world_size)
    _pending.setdefault(graph, {}).setdefault(key, []).append(packed)
    packed.group_key = key  # type: ignore[attr-defined]
    packed.making = making  # type: ignore[attr-defined]
    return packed


def _seal(packed: PackedTable) -> None:
    """Makes the group variable of ``packed`` and of every table of its group waiting with it."""
    graph = tf.compat.v1.get_default_graph()
    key = packed.group_key  # type: ignore[attr-defined]
    members = _pending.get(graph, {}).pop(key, [])
    if packed not in members:
        raise ValueError(f"table {packed.name!r} is looked up in another graph than the one it was made in")
    count = _sealed.setdefault(graph, {}).get(key, 0)
    _sealed[graph][key] = count + 1
    info = shard_of(members[0])
    with tf.init_scope(), graph.name_scope(None), packed.making(info):  # type: ignore[attr-defined]
        group = PackedGroup(members=members, dtype=packed.dtype,
                            name=group_name(members[0].name, count))
    tf.compat.v1.add_to_collection(SHARDED_COLLECTION, group.variable)
    shards.pack([t.name for t in members], group.name)


def seal_pending(graph: Optional[tf.Graph] = None) -> None:
    """Makes the group variable of every packing group of ``graph`` (default: the current one) still waiting for
    its first lookup: what the initializer and the default Saver need, for a table made but never looked up
    (a model whose tables one graph makes, another, the evaluation graph, reads by name)."""
    if tf.executing_eagerly():
        return
    graph = graph or tf.compat.v1.get_default_graph()
    for members in list(_pending.get(graph, {}).values()):
        if members:
            with graph.as_default():
                _seal(members[0])


def set_initial(table: PackedTable, rows: tf.Tensor) -> None:
    """Makes ``rows`` (this worker's rows of the table) ``table``'s initial value (a warm start): before the seal
    the group takes them; after it, the group variable's initializer writes them with its other tables' initial
    rows unchanged (the same ops, so the same random values)."""
    table.initial = lambda: rows
    group = table._group  # pylint: disable=protected-access
    if group is None:
        return
    var = group.variable
    with tf.init_scope(), var.graph.name_scope(None):
        initial = tf.convert_to_tensor(var.initial_value)
        value = tf.concat([rows if t is table else tf.slice(initial, [t.offset, 0], [t.rows, -1])
                           for t in group.tables], 0)
        set_initializer(var, var.assign(value, read_value=False))
    var._initial_value = value  # pylint: disable=protected-access


def group_name(first: str, count: int = 0) -> str:
    """The name of the ``count``-th group variable whose first table is ``first``: in collective's own name scope
    (``collective_packed/<first>``), never in a scope of the program's (a layer named after a table, its variables
    found by that prefix, does not take the group variable for its own)."""
    return f"{PACKED_SCOPE}/{first}" + (f"_{count}" if count else "")


def group_of(var) -> Optional[PackedGroup]:
    """The packing group whose variable ``var`` is, else None."""
    return getattr(var, "_collective_packed", None)


def slot_group(var) -> Optional[PackedGroup]:
    """The packing group ``var`` is an optimizer slot (or other derived state) of, else None."""
    return getattr(var, "_collective_packed_slot_of", None)


def is_packed(var) -> bool:
    """Whether ``var`` is a packed table, a group variable or a group's slot."""
    return isinstance(var, PackedTable) or group_of(var) is not None or slot_group(var) is not None


# ------------------------------------------------------------------ gradients


def split_pairs(pairs: Sequence[tuple]) -> List[tuple]:
    """``(grad, var)`` pairs with each group variable's pair replaced by its tables' pairs (the gradient's rows in
    each table's range, offset back)."""
    out: List[tuple] = []
    for grad, var in pairs:
        group = group_of(var)
        if group is None:
            out.append((grad, var))
        elif grad is None:
            out.extend((None, t) for t in group.tables)
        else:
            whole = _as_slices(grad, group.variable)
            parts = group.split_gradient(whole)
            for part in parts:  # merge_pairs gives back ``whole`` for the parts unchanged
                part._collective_split_of = (whole, parts)  # pylint: disable=protected-access
            out.extend(zip(parts, group.tables))
    return out


def merge_pairs(pairs: Sequence[tuple]) -> List[tuple]:
    """``(grad, var)`` pairs with each group's tables' pairs merged into one pair of the group variable, where the
    first of them stood; refused, naming the tables, when a pair holds some of a group's tables but not all. The
    tables' gradients exactly as :func:`split_pairs` made them (``minimize``, no clipping) give back the group's
    gradient they were split from, so the step runs neither the split nor the merge."""
    groups: Dict[int, Tuple[PackedGroup, Dict[int, object]]] = {}
    out: List[Optional[tuple]] = []
    for grad, var in pairs:
        if not isinstance(var, PackedTable):
            out.append((grad, var))
            continue
        group = var.group
        if id(group) not in groups:
            groups[id(group)] = (group, {})
            out.append((id(group), None))
        groups[id(group)][1][id(var)] = grad
    merged: Dict[int, tuple] = {}
    for key, (group, grads) in groups.items():
        missing = [t.name for t in group.tables if id(t) not in grads]
        if missing:
            raise ValueError(f"packing group {group.name!r}: apply_gradients updates tables "
                             f"{[t.name for t in group.tables if id(t) in grads]} but not {missing}, which share its "
                             "variable: update all its tables together, or set COLLECTIVE_PACKING=0")
        ordered = [grads[id(t)] for t in group.tables]
        whole, parts = getattr(ordered[0], "_collective_split_of", (None, ()))
        if len(parts) == len(ordered) and all(a is b for a, b in zip(parts, ordered)):
            merged[key] = (whole, group.variable)  # the split gradient unchanged: no split or merge runs
            continue
        if all(g is None for g in ordered):
            merged[key] = (None, group.variable)
            continue
        slices = [_empty_slices(t) if g is None else _as_slices(g, t) for g, t in zip(ordered, group.tables)]
        merged[key] = (group.merge_gradients(slices), group.variable)
    return [merged[p[0]] if p[1] is None and p[0] in merged else p for p in out]


def _as_slices(grad, var) -> tf.IndexedSlices:
    if isinstance(grad, tf.IndexedSlices):
        return grad
    dense = tf.convert_to_tensor(grad)
    rows = tf.range(tf.shape(dense, out_type=tf.int64)[0])
    return tf.IndexedSlices(dense, rows, tf.shape(dense, out_type=tf.int64))


def _empty_slices(t: PackedTable) -> tf.IndexedSlices:
    return tf.IndexedSlices(tf.zeros([0, t.dim], t.dtype), tf.zeros([0], tf.int64),
                            tf.constant([t.rows, t.dim], tf.int64))


def map_var_list(var_list):
    """``var_list`` (of ``compute_gradients``) with packed tables replaced by their group variables, once each."""
    if not isinstance(var_list, (list, tuple)):
        return var_list
    out, seen = [], set()
    for var in var_list:
        if isinstance(var, PackedTable):
            var = var.group.variable
        if id(var) not in seen:
            seen.add(id(var))
            out.append(var)
    return out


# ------------------------------------------------------------------ checkpoints


class RowsView:
    """A table's rows (or its slot's) in a group variable, as the Saver sees a table's local variable: tagged with
    the table's ``ShardInfo`` under its unpacked name; reads slice, assigns scatter into the group's rows."""

    def __init__(self, var: tf.Variable, table_: PackedTable, name: str, slot_of: Optional["RowsView"] = None):
        self._var, self._table, self.name = var, table_, name
        self.packed_table = table_  # whose touched-row marks are this view's (collective.checkpoint.touched)
        self.graph = var.graph
        info = shard_of(table_)
        width = var.shape[1] if var.shape.rank == 2 else table_.dim
        self._collective_shard = dataclasses.replace(info, name=name, dim=int(width))
        if slot_of is not None:
            self._collective_slot_of = slot_of
        self.dtype = var.dtype
        self.shape = tf.TensorShape([table_.rows, width])
        self.op = NamedOp(name)
        self._fetched: Optional[tf.Tensor] = None

    def read_value(self) -> tf.Tensor:
        return tf.slice(self._var.value(), [self._table.offset, 0], [self._table.rows, -1])

    @property
    def initializer(self) -> tf.Operation:
        """The initializer of the variable holding the rows (``variables_initializer`` of a listing)."""
        return self._var.initializer

    def is_initialized(self, name: Optional[str] = None) -> tf.Tensor:
        return self._var.is_initialized(name=name)

    def _as_graph_element(self) -> tf.Tensor:
        """What ``sess.run(view)`` fetches: the rows, one read made on first use outside any control dependency or
        control flow, in a finalized graph too."""
        if self._fetched is None:
            with extending(self.graph), self.graph.control_dependencies(None), self.graph.name_scope(None):
                self._fetched = self.read_value()
        return self._fetched

    def value(self) -> tf.Tensor:
        return self.read_value()

    def assign(self, value, read_value: bool = False):  # pylint: disable=unused-argument
        rows = row_range(self._table.offset, self._table.rows)
        return write_rows(self._var, tf.IndexedSlices(value, rows))

    def scatter_update(self, sparse_delta: tf.IndexedSlices) -> tf.Operation:
        """Writes ``sparse_delta``'s rows (local rows of the table) into the group's rows: how a delta's restore
        writes the rows it holds (``collective.checkpoint.logical.assign_owned``)."""
        indices = sparse_delta.indices + tf.constant(self._table.offset, dtype=sparse_delta.indices.dtype)
        return write_rows(self._var, tf.IndexedSlices(sparse_delta.values, indices))


def _read_rows_view(view: RowsView, dtype=None, name=None, as_ref=False):  # pylint: disable=unused-argument
    value = view.read_value()
    if dtype is not None and not dtype.is_compatible_with(value.dtype):
        raise ValueError(f"{view.name!r} of dtype {value.dtype.name} read as {dtype.name}")
    return value


# A view reads as its rows (tf.convert_to_tensor(optimizer.get_slot(table, name))), as a slot variable does.
tf.register_tensor_conversion_function(RowsView, _read_rows_view)


def _slot_name(var, group: PackedGroup, t: PackedTable) -> str:
    """The name the unpacked table ``t``'s slot (or derived variable) has, for ``var`` of ``group``'s variable."""
    name, group_name = var.op.name, group.variable.op.name
    if group_name not in name:
        raise ValueError(f"variable {name!r} of packing group {group_name!r} does not hold the group's name, so it "
                         "cannot be saved under its tables' names: set COLLECTIVE_PACKING=0")
    return name.replace(group_name, t.name, 1)


def slot_view(slot: tf.Variable, table_: PackedTable) -> RowsView:
    """``table_``'s rows of ``slot`` (an optimizer slot of its group variable) under the name the unpacked table's
    slot has: what ``optimizer.get_slot(table, name)`` gives for a packed table in ``scope()``. One view per slot
    and table."""
    views = slot.__dict__.setdefault("_collective_table_views", {})
    if id(table_) not in views:
        view = RowsView(slot, table_, _slot_name(slot, table_.group, table_),
                        RowsView(table_.group.variable, table_, table_.name))
        views[id(table_)] = view
    return views[id(table_)]


def get_slot(get: Callable, var, *args, **kwargs):
    """``get(var, name)`` (an optimizer's ``get_slot``); of a packed table, its rows of its group's slot
    (:func:`slot_view`), None while the group has no such slot."""
    if not isinstance(var, PackedTable):
        return get(var, *args, **kwargs)
    slot = get(var.group.variable, *args, **kwargs)
    return None if slot is None else slot_view(slot, var)


def listing(variables: Sequence, scope: Optional[str] = None) -> List:
    """``variables`` (a graph's global variables) with each group variable replaced by its tables, and the packed
    tables of the current graph not sealed yet added (those that match ``scope``, a ``re.match`` pattern, when it
    is given): how ``tf.compat.v1.global_variables()`` lists them in ``scope()``, so that a program finds its
    table by name. A slot of a group variable is listed as its tables' slots (:func:`slot_view`: ``<table>/Adagrad``),
    as ``optimizer.get_slot(table, name)`` gives them."""
    out: List = []
    listed = set()
    for var in variables:
        group, slot = group_of(var), slot_group(var)
        if group is not None:
            items = group.tables
        elif slot is not None:  # the tables' rows of the group's slot, named as the unpacked tables' slots
            items = [slot_view(var, t) for t in slot.tables]
        else:
            items = [var]
        for item in items:
            if id(item) not in listed:
                listed.add(id(item))
                out.append(item)
    if not tf.executing_eagerly():
        out += [t for t in _made.get(tf.compat.v1.get_default_graph(), {}).values() if id(t) not in listed]
    if scope is None:
        return out
    pattern = re.compile(scope)
    return [v for v in out if hasattr(v, "name") and pattern.match(v.name)]


def made_tables(scope: Optional[str] = None) -> List[PackedTable]:
    """The packed tables the getter made in the current graph, in the order made (those whose name
    ``re.match``-es ``scope`` when it is given), sealed or not."""
    return [t for t in listing([], scope) if isinstance(t, PackedTable)]


def expand_for_saving(var_list: Sequence) -> List:
    """``var_list`` with each group variable, and each of its slots, replaced by its tables' :class:`RowsView`
    under the names the unpacked tables (and their slots) have."""
    out: List = []
    views: Dict[int, RowsView] = {}
    saved = set()

    def view_of(t: PackedTable) -> RowsView:
        if id(t) not in views:
            views[id(t)] = RowsView(t.group.variable, t, t.name)
        return views[id(t)]

    def add(item) -> None:
        if id(item) not in saved:  # a table listed by global_variables() and its group variable: saved once
            saved.add(id(item))
            out.append(item)

    for var in var_list:
        group = group_of(var)
        slot = slot_group(var)
        if group is not None:
            for t in group.tables:
                add(view_of(t))
        elif isinstance(var, PackedTable):
            add(view_of(var))
        elif slot is not None:
            out.extend(RowsView(var, t, _slot_name(var, slot, t), view_of(t)) for t in slot.tables)
        else:
            out.append(var)
    return out


def expand_mapping(var_list: Mapping) -> List[Tuple[str, object]]:
    """``(name, variable)`` pairs of a ``{name: variable}`` var_list (``ExponentialMovingAverage
    .variables_to_restore()``) where each packed table is a :class:`RowsView` of its rows saved under its name,
    a group variable the views of its tables not mapped by name already (under their own names), and a group's
    slot its tables' slot views."""
    mapped = {id(v) for v in var_list.values() if isinstance(v, PackedTable)}
    out: List[Tuple[str, object]] = []
    for name, var in var_list.items():
        group, slot = group_of(var), slot_group(var)
        if isinstance(var, PackedTable):
            out.append((name, RowsView(var.group.variable, var, name)))
        elif group is not None:
            out += [(t.name, RowsView(var, t, t.name)) for t in group.tables if id(t) not in mapped]
        elif slot is not None:
            out += [(view.name, view) for view in (slot_view(var, t) for t in slot.tables)]
        else:
            out.append((name, var))
    return out
