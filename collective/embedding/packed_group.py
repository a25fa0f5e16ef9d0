"""One physical variable for a packing group (issue 44, stage 2 prototype; docs/packing.md).

Design B of the stage-2 prototype: the group variable is the only real
variable. Each table of the group is a :class:`PackedTable`, which is not a
variable: lookups resolve it to the group variable at ``ids + offset``, so
``tf.gradients`` / ``compute_gradients`` return one ``IndexedSlices`` on the
group variable and the optimizer applies it with one sparse update and keeps
one set of slots per group. Checkpoints keep the logical per-table format:
:meth:`PackedGroup.saveables` saves each table's rows, and each slot's, under
the name the unpacked table (and its slot) would have, and restores them into
the table's rows of the group.

Not wired into ``CollectiveStrategy`` yet: a prototype that
``tests/test_packed_group.py`` trains against unpacked tables under both
TensorFlow behaviours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from collective.tf_internals import extending, object_identity, saveable_object_util

SaveableObject = saveable_object_util.saveable_object.SaveableObject
SaveSpec = saveable_object_util.saveable_object.SaveSpec


_local = threading.local()


@contextlib.contextmanager
def seals_deferred() -> Iterator[None]:
    """Inside the block a table whose group is not sealed yet gives no graph element instead of sealing it
    (TensorFlow's ``name_scope(values=[table, ...])``, in ``safe_embedding_lookup_sparse``, asks each input for
    one): the coalesced lookups of ``input_layer`` run at the block's end, when every table of its columns is
    made, so one lookup seals them all into one group."""
    previous = getattr(_local, "deferred", False)
    _local.deferred = True
    try:
        yield
    finally:
        _local.deferred = previous


@dataclasses.dataclass(frozen=True)
class NamedOp:
    """What a packed table, or a view of its rows, gives as its ``op``: only the name its unpacked variable's op
    has (not an operation of the graph)."""

    name: str


class PackedTable:
    """Rows ``[offset, offset + rows)`` of a group variable, standing for the table ``name``.

    Made by :class:`PackedGroup` from a table's value, or by the strategy's getter before its group exists
    (:mod:`collective.embedding.packed_tables`): then ``seal`` makes the group the first time it is needed
    (``initial`` gives the table's rows of the group's initial value; ``info``, its shard, tags the object as
    the table, so lookups, gradient norms and the optimizer wrapper know it).
    """

    def __init__(self, name: str, rows: int, dim: int, dtype: tf.DType = tf.float32, info=None,
                 initial: Optional[Callable[[], tf.Tensor]] = None,
                 seal: Optional[Callable[["PackedTable"], None]] = None):
        self.name, self.rows, self.dim, self.dtype = name, int(rows), int(dim), tf.as_dtype(dtype)
        self.initial, self._seal = initial, seal
        self.offset: Optional[int] = None
        self._group: Optional["PackedGroup"] = None
        self._fetched: Optional[tf.Tensor] = None
        if info is not None:
            self._collective_shard = info
        # TensorFlow's safe_embedding_lookup_sparse passes a resource variable on to embedding_lookup_sparse (which
        # scope() serves) instead of converting it to a tensor: so it does this table.
        self._should_act_as_resource_variable = True

    def __repr__(self) -> str:
        return f"<PackedTable {self.name!r} shape={self.shape} offset={self.offset}>"

    @property
    def group(self) -> "PackedGroup":
        """The group holding the table's rows (made now if the table is not sealed yet)."""
        if self._group is None and self._seal is not None:
            self._seal(self)
        if self._group is None:
            raise ValueError(f"table {self.name!r} belongs to no packing group")
        return self._group

    def join(self, group: "PackedGroup", offset: int) -> None:
        """Places the table at rows ``[offset, offset + rows)`` of ``group``."""
        self._group, self.offset = group, int(offset)

    @property
    def graph(self) -> tf.Graph:
        return self.group.variable.graph

    def sealed_offset(self) -> int:
        """The table's first row in its group (sealing the group if needed)."""
        if self.offset is None:
            self.group.variable  # pylint: disable=pointless-statement  # seals the group
        return self.offset

    @property
    def shape(self) -> tf.TensorShape:
        """The table's local shape ``[rows, dim]`` (its logical one at world size 1)."""
        return tf.TensorShape([self.rows, self.dim])

    def get_shape(self) -> tf.TensorShape:
        return self.shape

    def group_ids(self, ids: tf.Tensor) -> tf.Tensor:
        """Local rows ``ids`` of this table as rows of the group variable."""
        return ids + tf.constant(self.sealed_offset(), dtype=ids.dtype)

    def lookup(self, ids: tf.Tensor) -> tf.Tensor:
        """``tf.nn.embedding_lookup(table, ids)``, read from the group variable."""
        return tf.nn.embedding_lookup(self.group.variable, self.group_ids(ids))

    def value(self) -> tf.Tensor:
        """The table's rows (for a regularizer or a norm): a slice of the group variable's value."""
        offset = self.sealed_offset()
        return tf.slice(self.group.variable.value(), [offset, 0], [self.rows, -1])

    def read_value(self) -> tf.Tensor:
        return self.value()

    @property
    def op(self) -> NamedOp:
        """The table's name as its unpacked variable's op has it (not an operation of the graph)."""
        return NamedOp(self.name)

    @property
    def trainable(self) -> bool:
        return True

    @property
    def initializer(self) -> tf.Operation:
        """The group variable's initializer (sealing the group if needed): it initialises the table's rows."""
        return self.group.variable.initializer

    def is_initialized(self, name: Optional[str] = None) -> tf.Tensor:
        return self.group.variable.is_initialized(name=name)

    def _written(self, op: tf.Operation, read_value: bool):
        if not read_value:
            return op
        with tf.control_dependencies([op]):
            return self.value()

    def _rows(self, indices) -> tf.Tensor:
        indices = tf.convert_to_tensor(indices)
        return indices + tf.constant(self.sealed_offset(), dtype=indices.dtype)

    def assign(self, value, use_locking=None, name=None, read_value=True):  # pylint: disable=unused-argument
        """Writes ``value`` (``[rows, dim]``) into the table's rows of its group (an uninitialized group starts at
        zeros, :func:`write_rows`); the table's new rows, or the op when ``read_value`` is False."""
        rows = row_range(0, self.rows)
        return self._written(write_rows(self.group.variable, tf.IndexedSlices(value, self._rows(rows))), read_value)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):  # pylint: disable=unused-argument
        rows = row_range(0, self.rows)
        return self.scatter_add(tf.IndexedSlices(delta, rows), read_value=read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):  # pylint: disable=unused-argument
        rows = row_range(0, self.rows)
        return self.scatter_sub(tf.IndexedSlices(delta, rows), read_value=read_value)

    def _scatter(self, method: str, sparse_delta: tf.IndexedSlices, read_value: bool):
        var = self.group.variable
        delta = tf.IndexedSlices(tf.convert_to_tensor(sparse_delta.values, var.dtype.base_dtype),
                                 self._rows(sparse_delta.indices))
        if method == "scatter_update":
            return self._written(write_rows(var, delta), read_value)
        return self._written(getattr(var, method)(delta).op, read_value)

    def scatter_update(self, sparse_delta, use_locking=False, name=None, read_value=True):  # pylint: disable=unused-argument
        """Writes ``sparse_delta``'s rows (rows of this table) into the group's rows."""
        return self._scatter("scatter_update", sparse_delta, read_value)

    def scatter_add(self, sparse_delta, use_locking=False, name=None, read_value=True):  # pylint: disable=unused-argument
        return self._scatter("scatter_add", sparse_delta, read_value)

    def scatter_sub(self, sparse_delta, use_locking=False, name=None, read_value=True):  # pylint: disable=unused-argument
        return self._scatter("scatter_sub", sparse_delta, read_value)

    def ref(self):
        """A hashable reference to the table (``Variable.ref()``: sets and dicts keyed by variables)."""
        return object_identity.Reference(self)

    def experimental_ref(self):
        return self.ref()

    def _as_graph_element(self) -> tf.Tensor:
        """What ``sess.run(table)`` fetches: the table's rows, one read made on first use outside any control
        dependency or control flow (as a variable's graph element is), in a finalized graph too."""
        if self._group is None and getattr(_local, "deferred", False):
            return None  # asked for its graph only (seals_deferred)
        if self._fetched is None:
            graph = self.group.variable.graph
            with extending(graph), graph.control_dependencies(None), graph.name_scope(None):
                self._fetched = self.value()
        return self._fetched


def _read_packed_table(table: PackedTable, dtype=None, name=None, as_ref=False):  # pylint: disable=unused-argument
    value = table.value()
    if dtype is not None and not dtype.is_compatible_with(value.dtype):
        raise ValueError(f"table {table.name!r} of dtype {value.dtype.name} read as {dtype.name}")
    return value


# A packed table reads as its rows (``tf.shape(table)``, ``tf.convert_to_tensor(table)``), as a variable does.
tf.register_tensor_conversion_function(PackedTable, _read_packed_table)


def row_range(start: int, count: int) -> tf.Tensor:
    """Rows ``[start, start + count)`` as int64: ``tf.range`` without its op named ``delta`` (the Saver's delta ops
    are built on first use, and tests look for them by that name)."""
    return tf.raw_ops.Range(start=tf.constant(start, tf.int64, name="first_row"),
                            limit=tf.constant(start + count, tf.int64, name="end_row"),
                            delta=tf.constant(1, tf.int64, name="step"), name="rows")


def write_rows(var: tf.Variable, rows: tf.IndexedSlices) -> tf.Operation:
    """Writes ``rows`` (rows of the group variable ``var``, or of one of its slots) into ``var``; where ``var`` is
    not initialized yet (a restore without the initializer: Estimator's evaluate and predict), it first holds
    zeros, so a restore of every table of the group gives it all its rows. Writes of one variable in one run go
    one after another (the Saver restores one tensor at a time), or the zeros of one would wipe another's rows."""
    values = tf.convert_to_tensor(rows.values, var.dtype.base_dtype)
    indices = rows.indices

    def scatter():
        with tf.control_dependencies([var.scatter_update(tf.IndexedSlices(values, indices)).op]):
            return tf.constant(True)

    def zeros_then_scatter():
        with tf.control_dependencies([var.assign(tf.zeros(var.shape, var.dtype.base_dtype), read_value=False)]):
            return scatter()

    return tf.cond(var.is_initialized(), scatter, zeros_then_scatter).op


class _RowsSaveable(SaveableObject):
    """Rows ``[offset, offset + rows)`` of ``var`` saved and restored under ``name``."""

    def __init__(self, var: tf.Variable, offset: int, rows: int, name: str):
        self._var, self._offset, self._rows = var, offset, rows
        value = tf.slice(var.value(), [offset, 0], [rows, -1])
        super().__init__(value, [SaveSpec(value, "", name, dtype=var.dtype)], name)

    def restore(self, restored_tensors, restored_shapes):  # pylint: disable=unused-argument
        rows = row_range(self._offset, self._rows)
        return write_rows(self._var, tf.IndexedSlices(restored_tensors[0], rows))


class PackedGroup:
    """One resource variable ``name`` (by default ``<first table>/packed``; the strategy's are
    ``collective_packed/<first table>``) holding the tables' rows in the order given."""

    def __init__(self, tables: Sequence[Tuple[str, np.ndarray]] = (), dtype: tf.DType = tf.float32,
                 members: Sequence[PackedTable] = (), name: Optional[str] = None):
        """``tables``: each table's name and initial value ``[rows, dim]`` (all of one ``dim``); or ``members``,
        tables made before their group, whose ``initial()`` gives their rows."""
        members = list(members) or [PackedTable(table, value.shape[0], value.shape[1], dtype,
                                                initial=functools.partial(tf.constant, value, dtype))
                                    for table, value in tables]
        dims = {t.dim for t in members}
        if len(dims) != 1:
            raise ValueError(f"tables {[t.name for t in members]} of one packing group need one dim, got "
                             f"{sorted(dims)}: give them separate groups")
        self.dim = dims.pop()
        self.name = name or f"{members[0].name}/packed"
        offsets = np.cumsum([0] + [t.rows for t in members])
        for t, offset in zip(members, offsets):
            t.join(self, offset)
        self.tables: List[PackedTable] = members
        if tables:
            initial = np.concatenate([value for _, value in tables]).astype(tf.as_dtype(dtype).as_numpy_dtype)
        else:
            def initial():
                return tf.concat([t.initial() for t in members], 0)
        self.variable = tf.compat.v1.Variable(initial, dtype=dtype, name=self.name, use_resource=True)
        self.variable._collective_packed = self  # pylint: disable=protected-access

    def split_gradient(self, grad: tf.IndexedSlices) -> List[tf.IndexedSlices]:
        """The group variable's gradient as each table's (its rows, indices back in the table's range), so
        per-table transforms (``tf.clip_by_norm``, summaries) see what unpacked tables would get."""
        ends = tf.constant([t.offset + t.rows for t in self.tables], dtype=grad.indices.dtype)
        owner = tf.cast(tf.searchsorted(ends, grad.indices, side="right"), tf.int32)
        indices = tf.dynamic_partition(grad.indices, owner, len(self.tables))
        values = tf.dynamic_partition(grad.values, owner, len(self.tables))
        return [tf.IndexedSlices(v, i - tf.constant(t.offset, dtype=i.dtype),
                                 tf.constant([t.rows, self.dim], dtype=i.dtype))
                for t, i, v in zip(self.tables, indices, values)]

    def merge_gradients(self, grads: Sequence[tf.IndexedSlices]) -> tf.IndexedSlices:
        """The tables' gradients (in :attr:`tables` order) as one gradient of the group variable."""
        if len(grads) != len(self.tables) or not all(isinstance(g, tf.IndexedSlices) for g in grads):
            raise ValueError(f"packing group {self.name!r} applies one IndexedSlices per table of "
                             f"{[t.name for t in self.tables]}, got {[type(g).__name__ for g in grads]}: "
                             "update all its tables together, or set COLLECTIVE_PACKING=0")
        indices = tf.concat([g.indices + tf.constant(t.offset, dtype=g.indices.dtype)
                             for t, g in zip(self.tables, grads)], 0)
        return tf.IndexedSlices(tf.concat([g.values for g in grads], 0), indices,
                                tf.constant([self.tables[-1].offset + self.tables[-1].rows, self.dim],
                                            dtype=indices.dtype))

    def _named_rows(self, var: tf.Variable) -> List[SaveableObject]:
        # A slot's name holds its variable's (``<var>/Adagrad``, Keras: ``Adagrad/<var>/accumulator``).
        group_name, name = self.variable.op.name, var.op.name
        if group_name not in name:
            raise ValueError(f"variable {name!r} of packing group {group_name!r} does not hold the group's name, so "
                             "it cannot be saved under its tables' names: set COLLECTIVE_PACKING=0")
        return [_RowsSaveable(var, t.offset, t.rows, name.replace(group_name, t.name, 1)) for t in self.tables]

    def saveables(self, optimizer=None, derived: Sequence[tf.Variable] = ()) -> List[SaveableObject]:
        """Each table's rows under its own name; given the optimizer that trains the group (``tf.compat.v1.train``
        or legacy Keras), each slot's rows under the name the unpacked table's slot has (``<table>/Adagrad``,
        ``Adagrad/<table>/accumulator``); likewise each ``derived`` variable made from the group variable's value
        (an ``ExponentialMovingAverage`` shadow: ``<table>/ExponentialMovingAverage``)."""
        variables = [self.variable] + list(derived)
        if optimizer is not None:
            slots = (optimizer.get_slot(self.variable, name) for name in optimizer.get_slot_names())
            variables += [slot for slot in slots if slot is not None]
        for var in variables:
            if not var.shape.is_compatible_with(self.variable.shape):
                raise ValueError(f"variable {var.op.name!r} of shape {var.shape} is not shaped like packing group "
                                 f"{self.name!r} {self.variable.shape}: set COLLECTIVE_PACKING=0")
        return [saveable for var in variables for saveable in self._named_rows(var)]
