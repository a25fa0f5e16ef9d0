"""Every sharded table and every variable derived from it, known by the variable object.

``CollectiveStrategy.embedding_scope()`` installs :func:`sharding_getter`
(for ``get_variable``) and :func:`sharding_creator` (for Keras
``add_weight`` and ``tf.Variable``): a 2-D variable made there becomes this
worker's shard of a logical ``[vocab, dim]`` table, tagged with its
:class:`~collective.embedding.table.ShardInfo` (:func:`shard_of`).

Optimizer slots (Adagrad's accumulator, Adam's moments, ...) are derived
variables: :func:`watch_slots` wraps an optimizer's slot-creating methods,
which all take the table as their first argument, so each slot made for a
table is tagged as the table's rows the moment it is created, whatever its
name, wherever the optimizer was built and whichever optimizer family it is
(``tf.compat.v1.train``, ``hb.train``, legacy Keras, Keras). Nothing here
matches a variable by name.

Any other variable made from a table's value is derived too
(:func:`derived_table`): an ``ExponentialMovingAverage`` shadow (its initial
value reads the table), ``tf.Variable(tf.zeros_like(table))`` (an
accumulator: ``zeros_like`` drops the table from the graph, so it is noted
when called, :func:`note_value_of`), ``tf.Variable(table.read_value())``.
Such a variable, shaped like the table's rows, is tagged as the table's rows
(:func:`tag_derived`) when it is made: never broadcast, saved, restored
(N -> M) and exported as the table is.

A table's regularizer (``get_variable(..., regularizer=...)``) is applied to
this worker's rows; its loss is counted N times on each worker with a
gradient counted once (:func:`sharded_regularizer`), so the gradient is one
process's and the workers' mean loss is one process's loss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional

import tensorflow as tf

from collective.embedding import modes, packed_tables
from collective.embedding.table import (SHARDED_COLLECTION, ShardInfo, partitioned_initializer, shard_initial_value,
                                        shard_of, tag)
from collective.sharding import shards
from collective.sharding.plan import PlanError
from collective.sharding.planner import ORDINARY, TableSpec

if TYPE_CHECKING:
    from collective.context import Context

__all__ = ["ShardInfo", "shard_of", "sharding_getter", "sharding_creator", "custom_getter", "creating_shard",
           "current_shard", "inside_embedding_scope", "embedding_scope_block", "deriving", "deriving_from",
           "watch_slots", "slot_owner", "sharded_regularizer", "derived_table", "note_value_of", "tag_derived"]

_local = threading.local()
# Per graph: ops whose output is a value made from a table's without reading it (zeros_like), by op -> table.
_values_of: "weakref.WeakKeyDictionary[tf.Graph, Dict[tf.Operation, tf.Variable]]" = weakref.WeakKeyDictionary()
# How far back an initial value's inputs are searched for a table.
_SEARCH_OPS = 2000

# Slot-creating methods of every optimizer family, each taking the table first (positionally or by keyword).
SLOT_METHODS = ("_zeros_slot", "_get_or_make_slot", "_get_or_make_slot_with_initializer",  # tf.compat.v1.train
                "add_slot",                                                                # legacy Keras
                "add_variable_from_reference")                                             # Keras (2.11+)
_PRIMARY_KEYWORDS = ("var", "model_variable")


@contextlib.contextmanager
def _set(attribute: str, value) -> Iterator[None]:
    previous = getattr(_local, attribute, None)
    setattr(_local, attribute, value)
    try:
        yield
    finally:
        setattr(_local, attribute, previous)


def creating_shard(info: ShardInfo):
    """Marks the variables created inside the block as the shard ``info`` (they are not broadcast)."""
    return _set("shard", info)


def current_shard() -> Optional[ShardInfo]:
    """The shard being created now (:func:`creating_shard`), if any."""
    return getattr(_local, "shard", None)


def inside_embedding_scope() -> bool:
    """Whether variables made now go through ``embedding_scope()``'s getter and creator."""
    return bool(getattr(_local, "embedding_scope", False))


def embedding_scope_block():
    """Marks the block as ``embedding_scope()`` (see :func:`inside_embedding_scope`)."""
    return _set("embedding_scope", True)


@contextlib.contextmanager
def making_packed_group(info: ShardInfo) -> Iterator[None]:
    """The block that makes a packing group's variable: a shard like ``info``'s (never broadcast), passed
    through by the scope's creator."""
    with creating_shard(info), _set("in_getter", True):
        yield


def deriving_from() -> Optional[tf.Variable]:
    """The sharded table whose slot is being created now, if any (its slot is per-worker: never broadcast)."""
    return getattr(_local, "deriving", None)


def deriving(table: tf.Variable):
    """Marks the variables created inside the block as per-worker state of ``table`` (never broadcast or sharded)."""
    return _set("deriving", table)


def slot_owner(var) -> Optional[tf.Variable]:
    """The table ``var`` is a slot of (the object), else None."""
    return getattr(var, "_collective_slot_of", None)


def _source_table(var) -> Optional[tf.Variable]:
    """The table whose rows ``var`` holds (a table is its own; a slot or derived variable its table's)."""
    if shard_of(var) is None:
        return None
    owner = slot_owner(var)
    return var if owner is None else owner


def _variable_ops(graph: tf.Graph) -> Dict[tf.Operation, tf.Variable]:
    """The op that holds each table (and tagged slot) of ``graph``: resource handle or ref variable op."""
    ops = {}
    for var in graph.get_collection(SHARDED_COLLECTION):
        handle = getattr(var, "handle", None)
        ops[handle.op if handle is not None else var.op] = var
    return ops


def note_value_of(value, source) -> None:
    """Notes that tensor ``value`` was made from ``source``'s value (a table, or a tensor reading one).

    ``zeros_like(table)`` and ``ones_like(table)`` of a statically shaped
    table give a constant that no longer depends on it in the graph; the
    replacements of those functions under ``scope()`` call this so that
    :func:`derived_table` still finds the table.
    """
    if tf.executing_eagerly() or not isinstance(value, tf.Tensor):
        return
    table = _source_table(source)
    if table is None and isinstance(source, tf.Tensor) and source.op.inputs:
        table = _source_table(_variable_ops(source.graph).get(source.op.inputs[0].op))  # a read of a table
    if table is not None:
        _values_of.setdefault(value.graph, {})[value.op] = table


def derived_table(initial_value) -> Optional[tf.Variable]:
    """The table a variable with ``initial_value`` (a graph tensor) is made from, if it is shaped like its rows.

    The tensor's inputs are searched back (a bounded number of ops) for a
    table's variable op or a value noted by :func:`note_value_of`; known by
    object, never by name. A callable or eager initial value gives None.
    """
    if tf.executing_eagerly() or not isinstance(initial_value, tf.Tensor) or initial_value.shape.rank in (None, 0):
        return None
    graph = initial_value.graph
    noted = _values_of.get(graph, {})
    holders = _variable_ops(graph)
    if not holders:
        return None
    seen, queue = {initial_value.op}, [initial_value.op]
    while queue and len(seen) < _SEARCH_OPS:
        op = queue.pop(0)
        table = noted[op] if op in noted else _source_table(holders.get(op))
        if table is not None:
            rows = table.shape[0]
            return table if rows is not None and initial_value.shape[0] == rows else None
        for tensor in op.inputs:
            if tensor.op not in seen:
                seen.add(tensor.op)
                queue.append(tensor.op)
    return None


def tag_derived(var: tf.Variable, table: tf.Variable) -> tf.Variable:
    """Tags ``var``, made from ``table``'s value (:func:`derived_table`), as the table's rows; returns it."""
    return _tag_slot(var, table)


def _tag_slot(slot: tf.Variable, table: tf.Variable) -> tf.Variable:
    """Tags ``slot`` as rows of ``table``: same layout, vocabulary and hash index; its own name and width."""
    info = shard_of(table)
    if slot is table or shard_of(slot) is not None or slot.shape.rank is None or slot.shape.rank < 1:
        return slot
    slot._collective_slot_of = table  # pylint: disable=protected-access
    if tuple(slot.shape.as_list()[:1]) != tuple(table.shape.as_list()[:1]):
        return slot  # per-worker state not shaped like the rows (Adafactor's factored moments): never broadcast
    name = slot.op.name if not tf.executing_eagerly() else slot.name.split(":")[0]
    # The product of the trailing dims (a table-wise table's rank that holds no rows has slots of 0 rows).
    width = int(functools.reduce(lambda a, b: a * b, slot.shape.as_list()[1:], 1)) if slot.shape.is_fully_defined() \
        else info.local_dim
    if info.column_wise and width == info.local_dim:
        width = info.dim  # a slot sliced as its table is: the same logical width
    return tag(slot, dataclasses.replace(info, name=name, dim=width))


def watch_slots(optimizer, listener: Optional[Callable[[tf.Variable, tf.Variable], tf.Variable]] = None):
    """Makes ``optimizer`` tag each slot it creates for a sharded table as that table's rows; returns it.

    ``listener(slot, table)`` also runs for each such slot as it is created
    (``collective.sok.slots`` gives it SOK's checkpoint hooks there).
    Its ``get_slot(table, name)`` of a packed table gives the table's rows of
    its group's slot (:func:`collective.embedding.packed_tables.get_slot`)
    inside ``scope()`` and outside it.
    Idempotent: the methods are wrapped once per optimizer object.
    """
    state = optimizer.__dict__
    listeners: List[Callable] = state.setdefault("_collective_slot_listeners", [])
    if listener is not None and listener not in listeners:
        listeners.append(listener)
    if state.get("_collective_slots_watched"):
        return optimizer
    for name in SLOT_METHODS:
        method = getattr(optimizer, name, None)
        if callable(method):
            state[name] = _tagging_slots(listeners, method)
    get = getattr(optimizer, "get_slot", None)
    if callable(get):  # Keras' optimizers of TF 2.11+ have none
        state["get_slot"] = functools.wraps(get)(functools.partial(packed_tables.get_slot, get))
    state["_collective_slots_watched"] = True
    return optimizer


def _tagging_slots(listeners: List[Callable], create: Callable) -> Callable:
    @functools.wraps(create)
    def create_slot(*args, **kwargs):
        table = args[0] if args else next((kwargs[k] for k in _PRIMARY_KEYWORDS if k in kwargs), None)
        group = packed_tables.group_of(table)
        if group is not None:
            return _packed_slot(group, table, create, args, kwargs)
        if shard_of(table) is None:
            return create(*args, **kwargs)

        def tagging_creator(next_creator, **options):
            slot = _tag_slot(next_creator(**options), table)
            for listener in listeners:
                slot = listener(slot, table)
            return slot

        with _set("deriving", table), tf.variable_creator_scope(tagging_creator):
            return create(*args, **kwargs)

    return create_slot


def _packed_slot(group, table: tf.Variable, create: Callable, args, kwargs):
    """A slot of a packing group's variable: per-worker state of the group's rows (never broadcast), saved per
    table (:func:`collective.embedding.packed_tables.expand_for_saving`)."""

    def marking_creator(next_creator, **options):
        slot = next_creator(**options)
        slot._collective_packed_slot_of = group  # pylint: disable=protected-access
        return slot

    with _set("deriving", table), tf.variable_creator_scope(marking_creator):
        return create(*args, **kwargs)


def sharded_regularizer(regularizer: Callable, info: ShardInfo) -> Callable:
    """``regularizer`` of a row-sharded table: one process's gradient on these rows, its loss counted N times.

    Each worker holds ``1/N`` of the rows and the workers' losses are
    averaged, so the loss term is ``N * r(rows)`` in value (the mean over
    workers is ``r(table)``) while its gradient stays ``r'(rows)``, as one
    process computes it.
    """
    extra = info.world_size - 1

    def regularize(var):
        loss = regularizer(var)
        if loss is None or extra == 0:
            return loss
        return loss + tf.stop_gradient(tf.cast(extra, loss.dtype) * loss)

    return regularize


@contextlib.contextmanager
def custom_getter(added) -> Iterator[None]:
    """Adds the custom getter ``added`` to the current variable scope for the block.

    Re-entering the scope with ``variable_scope(..., custom_getter=...)``
    would reset the numbering of its sub-scopes on exit (a second
    ``input_layer`` would be named ``input_layer`` again): variables keep
    the names plain TensorFlow gives them only if no scope is opened.
    """
    scope = tf.compat.v1.get_variable_scope()
    previous = scope.custom_getter

    def composed(getter, *args, **kwargs):
        inner = getter if previous is None else functools.partial(previous, getter)
        return added(inner, *args, **kwargs)

    scope.set_custom_getter(composed)
    try:
        yield
    finally:
        scope.set_custom_getter(previous)


def _table_info(ctx: "Context", name: str, static: tf.TensorShape, dtype: tf.DType,
                replicate_below_bytes: int) -> Optional[ShardInfo]:
    """How a variable of shape ``static`` made in ``embedding_scope()`` is held, as the plan places it; None for an
    ordinary variable (not 2-D, exporting, or planned as one: see :mod:`collective.sharding.planner`)."""
    if modes.is_exporting() or not (static.rank == 2 and static.is_fully_defined()):
        return None
    spec = TableSpec(name, int(static[0]), int(static[1]), dtype.name)
    table = shards.plan_of(spec, replicate_below_bytes)
    if table.exchange == ORDINARY:
        return None
    return shards.shard_info(table, ctx.rank, ctx.world_size)


def _is_table(ctx: "Context", static: tf.TensorShape) -> bool:
    """Whether a variable of shape ``static`` made in ``embedding_scope()`` is a table (sharded or replicated)."""
    return static.rank == 2 and static.is_fully_defined() and static[0] >= ctx.world_size


def _whole_in_export(static: tf.TensorShape, partitioner, ctx: "Context"):
    """The partitioner an export gives a variable: none for a table, which training held as one logical table
    (rows by id, whatever the partitioner) and its checkpoint saved whole; the user's for other variables."""
    return None if modes.is_exporting() and _is_table(ctx, static) else partitioner


def sharding_creator(ctx: "Context", replicate_below_bytes: int):
    """A variable creator that shards the 2-D trainable variables Keras makes (``add_weight``)."""

    def create(next_creator, **kwargs):
        initial_value = kwargs.get("initial_value")
        shape = kwargs.get("shape")
        if shape is None and isinstance(initial_value, functools.partial) and len(initial_value.args) >= 1:
            shape = initial_value.args[0]
        if (getattr(_local, "in_getter", False) or deriving_from() is not None or kwargs.get("trainable") is False
                or initial_value is None or kwargs.get("variable_def") is not None
                or derived_table(initial_value) is not None):  # tagged by the scope's creator as it is made
            return next_creator(**kwargs)
        if shape is None and not callable(initial_value):
            initial_value = tf.convert_to_tensor(initial_value, dtype=kwargs.get("dtype"))
            shape = initial_value.shape  # tf.Variable(<a whole table>): a pretrained table
        dtype = tf.as_dtype(kwargs.get("dtype") or getattr(initial_value, "dtype", None) or tf.float32).base_dtype
        static = tf.TensorShape(shape) if shape is not None else tf.TensorShape(None)
        info = _table_info(ctx, _expected_name(kwargs.get("name") or "embedding"), static, dtype,
                           replicate_below_bytes)
        if info is None:
            return next_creator(**kwargs)
        _refuse_sliced_constraint(kwargs.get("constraint"), info)
        local_value = _local_initial_value(initial_value, info, dtype)
        kwargs = dict(kwargs, initial_value=local_value, shape=tf.TensorShape([info.local_rows, info.local_dim]),
                      dtype=dtype)
        with creating_shard(info):
            var = next_creator(**kwargs)
        shards.record_name(info.name, var.name.split(":")[0] if tf.executing_eagerly() else var.op.name)
        name = kwargs.get("name") if tf.executing_eagerly() else var.op.name
        return tag(var, dataclasses.replace(info, name=name or info.name))

    return create


def _expected_name(name: str) -> str:
    """The name a variable created now as ``name`` gets (its plan's name, before it exists)."""
    if tf.executing_eagerly():
        scope = tf.get_current_name_scope()
        return f"{scope}/{name}" if scope else name
    return tf.compat.v1.get_default_graph().unique_name(name, mark_as_used=False)


def _local_initial_value(initial_value, info: ShardInfo, dtype: tf.DType):
    """A callable giving this worker's rows of a Keras-style logical initial value."""
    if isinstance(initial_value, functools.partial) and initial_value.func is not None and \
            tuple(initial_value.args[:1]) and list(tf.TensorShape(initial_value.args[0])) == list(info.logical_shape):
        return lambda: shard_initial_value(initial_value.func, info, dtype)

    def rows_of_full_value():
        full = initial_value() if callable(initial_value) else initial_value
        return info.layout.local_part(tf.convert_to_tensor(full, dtype=dtype))

    return rows_of_full_value


def sharding_getter(ctx: "Context", replicate_below_bytes: int):
    """A ``get_variable`` custom getter that makes 2-D trainable variables sharded tables."""

    def get(getter, name, shape=None, dtype=None, initializer=None, partitioner=None, **kwargs):
        with _set("in_getter", True):
            return _get_sharded(getter, name, shape, dtype, initializer, partitioner, kwargs)

    def _get_sharded(getter, name, shape, dtype, initializer, partitioner, kwargs):
        packed = packed_tables.existing(name)
        if packed is not None:
            return packed
        if kwargs.get("trainable") is False or deriving_from() is not None:  # slots, step counters
            return getter(name, shape=shape, dtype=dtype, initializer=initializer, partitioner=partitioner,
                          **kwargs)
        if shape is None and initializer is not None and not callable(initializer):
            return _get_from_value(getter, name, dtype, initializer, partitioner, kwargs)
        dtype = tf.as_dtype(dtype or tf.float32)
        static = tf.TensorShape(shape) if shape is not None else tf.TensorShape(None)
        info = _table_info(ctx, name, static, dtype, replicate_below_bytes)
        if info is None:
            return getter(name, shape=shape, dtype=dtype, initializer=initializer,
                          partitioner=_whole_in_export(static, partitioner, ctx), **kwargs)
        logical_init = initializer if initializer is not None else tf.compat.v1.glorot_uniform_initializer()
        if partitioner is not None:
            logical_init = partitioned_initializer(logical_init, partitioner, static, dtype)

        def local_initializer(shape, dtype=dtype, partition_info=None):  # pylint: disable=unused-argument
            return shard_initial_value(logical_init, info, dtype)

        _refuse_sliced_constraint(kwargs.get("constraint"), info)
        if packed_tables.unpacked_reason(info, kwargs) is None:
            return packed_tables.table(name, info, dtype, lambda: local_initializer(None), making_packed_group)
        _shard_regularizer(kwargs, info)
        kwargs["use_resource"] = True
        with creating_shard(info):
            var = getter(name, shape=[info.local_rows, info.local_dim], dtype=dtype,
                         initializer=local_initializer, partitioner=None, **kwargs)
        return tag(var, info)

    def _get_from_value(getter, name, dtype, initializer, partitioner, kwargs):
        """``get_variable(name, initializer=<a whole table as a tensor or array>)``: a pretrained table."""
        value = tf.convert_to_tensor(initializer, dtype=dtype)
        derived = derived_table(value) is not None
        info = None if derived else _table_info(ctx, name, value.shape, value.dtype.base_dtype, replicate_below_bytes)
        if info is None:
            return getter(name, shape=None, dtype=dtype, initializer=initializer,
                          partitioner=_whole_in_export(value.shape, partitioner, ctx), **kwargs)
        _refuse_sliced_constraint(kwargs.get("constraint"), info)
        _shard_regularizer(kwargs, info)
        kwargs["use_resource"] = True
        with creating_shard(info):
            var = getter(name, shape=None, dtype=dtype, initializer=info.layout.local_part(value), partitioner=None,
                         **kwargs)
        return tag(var, info)

    return get


def _refuse_sliced_constraint(constraint, info: ShardInfo) -> None:
    """A ``constraint=`` of a ``column_wise`` table would see each rank's slice of every row, not the row (a
    ``MaxNorm(axis=1)`` would bound each slice's norm): refused when the table is made, naming it."""
    if constraint is not None and info.column_wise:
        raise PlanError(f"table {info.name!r}: placement 'column_wise' cannot apply its constraint= "
                        f"({getattr(constraint, '__name__', type(constraint).__name__)}): each worker holds a slice "
                        "of every row's dims, and the constraint would see the slice, not the row; place the table "
                        "row_wise or table_wise, or drop the constraint")


def _shard_regularizer(kwargs: dict, info: ShardInfo) -> None:
    if kwargs.get("regularizer") is not None and not info.replicated:
        kwargs["regularizer"] = sharded_regularizer(kwargs["regularizer"], info)
