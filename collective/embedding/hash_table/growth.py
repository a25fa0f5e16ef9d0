"""How a hash table grows from its initial allocation up to its capacity, keeping every key, row and slot row.

A table made with ``initial_capacity_per_worker`` below ``capacity_per_worker``
allocates, per worker, an index of ``slots[0]`` probe slots and ``sizes[0]``
rows of every per-row variable (values, a policy's ``usage``, optimizer
slots, incremental-checkpoint masks); the variables have an unknown first
dimension. Each step of :data:`Growth.sizes` doubles the index's slots
(``sizes[k]`` rows fill them to the load factor, the last is the capacity).

Rows are handed out densely in order of first sight whatever the
allocation, so growth never changes a key's row: a growing table trains
exactly what a table allocated at its capacity trains. When a training
lookup's (or a restore's) new keys would not fit, :meth:`HashTable.append
<collective.embedding.hash_table.index.HashTable.append>` first grows to the
smallest size holding them: the index is rehashed into the larger arrays and
the per-row variables known then (values, ``usage``, the counter's) are
padded with their initial row. Variables made later (optimizer slots, the
touched masks) catch up lazily (:meth:`HashTable.catch_up`) right before
they are written: slots before the optimizer's sparse update
(:func:`watch_updates`), masks before they are marked, and in restores.
Allocations never shrink.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from collective.embedding.table import shard_of
from collective.kernels.validation import check_table_shape
from collective.tf_internals import set_initializer

_SPARSE_APPLY = "_resource_apply_sparse_duplicate_indices"
"""The method every ``tf.compat.v1.train`` and legacy Keras optimizer updates a resource variable's rows with."""


class Growth:
    """The allocation steps of one growing table and the per-row variables that follow them.

    Args:
      name: the table's name (for errors).
      capacity: the most rows (keys) per worker.
      initial: rows allocated at first (below ``capacity``).
      load_factor: fraction of the probe slots that may be filled.
    """

    def __init__(self, name: str, capacity: int, initial: int, load_factor: float):
        last = check_table_shape(capacity, load_factor)
        slots = [check_table_shape(initial, load_factor)]
        while slots[-1] < last:
            slots.append(min(2 * slots[-1], last))
        self.name = name
        self.slots = slots
        self.sizes = [min(int(capacity), int(s * load_factor)) for s in slots[:-1]] + [int(capacity)]
        # Variables grown with the index (known when the lookup is built) and those that catch up later,
        # each with the row its new rows start as.
        self.with_index: List[Tuple[tf.Variable, np.ndarray]] = []
        self.lagging: List[Tuple[tf.Variable, np.ndarray]] = []

    def fill_of(self, var: tf.Variable) -> Optional[np.ndarray]:
        """The row ``var``'s new rows start as, if it is registered."""
        for known, row in self.with_index + self.lagging:
            if known is var:
                return row
        return None


def hidden(count: int) -> tf.Tensor:
    """``count`` as an int64 scalar whose value static shape inference does not see.

    Grappler infers a resource variable's shape from the values assigned to it in the graph it optimises; a
    growing table's variables get only values of unknown length (initial values, resets), or it would fold
    ``tf.shape`` of a read to the initial size.
    """
    return tf.compat.v1.placeholder_with_default(tf.constant(int(count), tf.int64), [])


def shape_of_rows(var: tf.Variable) -> tf.Tensor:
    """Rows ``var`` holds now (int64), read from the variable without reading its value."""
    return tf.raw_ops.VariableShape(input=var.handle, out_type=tf.int64)[0]


def padded(value: tf.Tensor, have: tf.Tensor, rows: tf.Tensor, fill: np.ndarray) -> tf.Tensor:
    """``value`` (``have`` rows) with rows of ``fill`` appended up to ``rows`` rows (unchanged when it has as many).

    Row counts come from the variables (:func:`shape_of_rows`), never from ``tf.shape`` of a read: Grappler may
    fold that to the shape the variable was first assigned.
    """
    missing = tf.maximum(rows - have, 0)
    extra = tf.broadcast_to(tf.constant(fill, value.dtype),
                            tf.concat([[missing], tf.constant(fill.shape, tf.int64)], axis=0))
    return tf.concat([value, extra], axis=0)


def grow_variable(var: tf.Variable, rows: tf.Tensor, fill: np.ndarray) -> tf.Operation:
    """Op padding ``var`` with rows of ``fill`` up to ``rows`` rows, when it holds fewer."""
    have = shape_of_rows(var)

    def grow():
        value = tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=var.dtype.base_dtype)
        with tf.control_dependencies([tf.raw_ops.AssignVariableOp(resource=var.handle,
                                                                  value=padded(value, have, rows, fill))]):
            return tf.constant(True)

    return tf.cond(have < rows, grow, lambda: tf.constant(False)).op


def initial_row(slot: tf.Variable, table: str) -> np.ndarray:
    """The value every row of optimizer slot ``slot`` starts with (what a freed or new row is set to).

    A slot of a growing table starts as ``fill(shape(table), value)``; others as a constant.
    """
    if slot.shape.rank is not None and slot.shape[1:].is_fully_defined():
        row = _constant_row(slot.initial_value)
        if row is not None:
            return np.broadcast_to(row, slot.shape[1:].as_list()).astype(slot.dtype.base_dtype.as_numpy_dtype)
    raise ValueError(f"hash table {table}: optimizer slot {slot.name} does not start every row at one constant "
                     "value, so a freed or new row cannot be reset to it; vocabulary policies and growing tables "
                     "support optimizers whose slots start constant (Adagrad, Adam, Momentum, Ftrl, RMSProp, ...)")


_ARITHMETIC = {"Mul": np.multiply, "AddV2": np.add, "Add": np.add, "Sub": np.subtract, "RealDiv": np.divide}


def _constant_row(tensor: tf.Tensor, depth: int = 0) -> Optional[np.ndarray]:
    """The one row (or a scalar) every row of ``tensor`` holds, worked out from its graph; None when unknown.

    Handles constants, ``Fill``, ``Identity`` and elementwise arithmetic of those (Ftrl's accumulator starts as
    ``ones(shape) * initial_accumulator_value``).
    """
    value = tf.get_static_value(tensor)
    if value is not None:
        value = np.asarray(value)
        if value.ndim == 0:
            return value
        if value.shape[0] > 0 and np.all(value == value[:1]):
            return value[0]
        return None
    op = tensor.op
    if depth > 8:
        return None
    if op.type == "Identity":
        return _constant_row(op.inputs[0], depth + 1)
    if op.type == "Fill":
        constant = tf.get_static_value(op.inputs[1])
        return None if constant is None else np.asarray(constant)
    if op.type in _ARITHMETIC:
        a, b = (_constant_row(t, depth + 1) for t in op.inputs)
        return None if a is None or b is None else _ARITHMETIC[op.type](a, b)
    return None


def remember_slot(slot: tf.Variable, table: tf.Variable) -> tf.Variable:
    """A ``watch_slots`` listener: a slot of a growing table is registered to catch up with its growth."""
    info = shard_of(table)
    index = info.hash_index if info is not None else None
    growth = getattr(index, "growth", None)
    if growth is None or slot is table or growth.fill_of(slot) is not None:
        return slot
    if slot.shape.rank is None or slot.shape[0] is not None:
        raise ValueError(f"hash table {index.name} grows, and its optimizer slot {slot.name} of shape {slot.shape} "
                         "is not one row per key; use a tf.compat.v1.train optimizer (Adagrad, Adam, Momentum, ...) "
                         "or allocate the table at its capacity (no initial_capacity_per_worker)")
    row = initial_row(slot, index.name)
    growth.lagging.append((slot, row))
    # TF1 Adagrad's slot starts as fill(shape(table)), read without waiting for the table's initializer (a
    # race in global_variables_initializer); it starts at the table's initial rows instead, then catches up.
    with tf.init_scope():
        start = tf.broadcast_to(tf.constant(row, slot.dtype.base_dtype),
                                tf.concat([[hidden(growth.sizes[0])], tf.constant(row.shape, tf.int64)], axis=0))
        set_initializer(slot, tf.raw_ops.AssignVariableOp(resource=slot.handle, value=start,
                                                          name=slot.op.name.replace("/", "_") + "_initial_rows"))
    return slot


def watch_updates(optimizer, variables: Iterable = ()):
    """Makes ``optimizer``'s sparse updates of a growing table's rows first grow its slots; returns it.

    Idempotent (the method is wrapped once per optimizer object). Raises ``ValueError`` naming the table when
    one of ``variables`` is a growing table and ``optimizer`` is not a ``tf.compat.v1.train`` optimizer (Keras
    optimizers make slots of the table's static shape, which a growing table does not have).
    """
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        for var in variables:
            info = shard_of(var)
            if getattr(info.hash_index if info is not None else None, "growth", None) is not None:
                raise ValueError(f"hash table {info.hash_index.name} grows (initial_capacity_per_worker), and "
                                 f"{type(optimizer).__name__} cannot make slots for a table of unknown size; train it "
                                 "with a tf.compat.v1.train optimizer, or allocate it at its capacity (no "
                                 "initial_capacity_per_worker / DynamicVariable(init_capacity=max_capacity))")
    state = optimizer.__dict__
    if state.get("_collective_growth_watched"):
        return optimizer
    method = getattr(optimizer, _SPARSE_APPLY, None)
    if callable(method):
        state[_SPARSE_APPLY] = _catching_up(method)
    if isinstance(optimizer, tf.compat.v1.train.FtrlOptimizer):
        state["_create_slots"] = _ftrl_slots(optimizer, optimizer._create_slots)  # pylint: disable=protected-access
    state["_collective_growth_watched"] = True
    return optimizer


def _growing(var) -> bool:
    info = shard_of(var)
    return getattr(info.hash_index if info is not None else None, "growth", None) is not None


def _ftrl_slots(optimizer, create: Callable) -> Callable:
    """``FtrlOptimizer._create_slots`` that also makes the accumulator of a table of unknown size.

    TensorFlow's builds it from an initializer of the table's static shape, which a growing table lacks
    (``get_variable`` then fails); like Adagrad's, it starts here as ``fill(shape(table), initial value)``.
    """

    @functools.wraps(create)
    def create_slots(var_list):
        create([v for v in var_list if not _growing(v)])
        for var in var_list:
            if _growing(var):
                # pylint: disable=protected-access
                with tf.compat.v1.colocate_with(var):
                    start = tf.fill(tf.shape(var), tf.constant(optimizer._initial_accumulator_value,
                                                               var.dtype.base_dtype))
                optimizer._get_or_make_slot(var, start, "accum", optimizer._accum_name or optimizer._name)
                optimizer._zeros_slot(var, "linear", optimizer._linear_name or optimizer._name)

    return create_slots


def _catching_up(apply: Callable) -> Callable:
    @functools.wraps(apply)
    def apply_sparse(grad, handle, indices, *args, **kwargs):
        info = shard_of(handle)
        index = info.hash_index if info is not None else None
        if getattr(index, "growth", None) is None:
            return apply(grad, handle, indices, *args, **kwargs)
        with tf.control_dependencies([grad, indices]):  # after this step's lookups grew the table
            grown = [index.catch_up(slot) for slot, _ in index.growth.lagging]
        with tf.control_dependencies(grown):
            return apply(grad, handle, indices, *args, **kwargs)

    return apply_sparse


def never_marked(dtype: tf.DType):
    """A per-row mark of a row never updated: not marked (a bool touched mask), or -inf (an update time).

    Rows a table grows by and rows an eviction frees get this mark.
    """
    return False if tf.as_dtype(dtype).base_dtype == tf.bool else -np.inf
