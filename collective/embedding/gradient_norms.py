"""One process's global norm of gradients that reach embedding tables as sparse slices.

``tf.clip_by_global_norm`` sums the squares of what each gradient holds. A
table's gradient in one process is ``IndexedSlices`` whose slices depend on
the lookup: one slice per id for ``embedding_lookup``, one per distinct id of
the whole batch for combined lookups, weighted or not (TensorFlow's
``embedding_lookup_sparse`` looks up the unique ids). On N workers a table's
gradient holds only this worker's rows, and an averaged replicated
variable's slices come from every worker's own batch, so the plain sum of
squares is not one process's.

Every lookup made in ``CollectiveStrategy.scope()`` records itself
(:func:`record`). ``compute_gradients`` (and ``tf.gradients`` inside the
scope, :func:`attaching`) then attaches to each sparse gradient it returns
the squared norm one process's gradient of that variable would have
(:func:`attach`), built into the graph only when a norm first asks for it (a
program that never clips pays nothing; ``apply_gradients``' averaging of a
gradient carries it over, :func:`carry`), and :func:`global_norm` (installed as
``tf.linalg.global_norm``, which ``tf.clip_by_global_norm`` calls) uses it, as
:func:`clip_by_norm` (installed as ``tf.clip_by_norm``, which Keras' ``clipnorm``
calls) does. A row-sharded table's dense
gradient (a regularizer made it dense) counts all workers' rows. TensorFlow's
own global norm of such a gradient (a clip outside the scope) is refused
when ``apply_gradients`` is built (:func:`refuse_foreign_norms`).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Dict, List, NamedTuple, Optional

import tensorflow as tf

from collective import comm
from collective.embedding.packed_group import PackedTable
from collective.embedding.table import shard_of
from collective.tf_internals import clip_ops, patches

OCCURRENCE, DISTINCT = "occurrence", "distinct"

_local = threading.local()


class _Lookup(NamedTuple):
    table: object
    output: tf.Tensor   # what the lookup returned
    kind: str           # OCCURRENCE: one slice per id in one process; DISTINCT: one per distinct id of the batch


_lookups: "weakref.WeakKeyDictionary[tf.Graph, List[_Lookup]]" = weakref.WeakKeyDictionary()
_attached: "weakref.WeakKeyDictionary[tf.Graph, Dict[object, object]]" = weakref.WeakKeyDictionary()
_owners: "weakref.WeakKeyDictionary[tf.Graph, Dict[object, str]]" = weakref.WeakKeyDictionary()  # their tables


def record(table, output: tf.Tensor, combiner: Optional[str] = None) -> None:
    """Records a lookup of ``table`` that returned ``output``: one vector per id, or with ``combiner`` one per
    sample, combined from its ids' vectors (weighted or not)."""
    if tf.executing_eagerly() or getattr(_local, "muted", False) or not hasattr(output, "graph"):
        return
    kind = DISTINCT if combiner is not None else OCCURRENCE
    _lookups.setdefault(output.graph, []).append(_Lookup(table, output, kind))


class muted:  # pylint: disable=invalid-name
    """Lookups made inside the block are not recorded (an outer lookup records its own vectors)."""

    def __enter__(self):
        self._previous = getattr(_local, "muted", False)
        _local.muted = True

    def __exit__(self, *exc):
        _local.muted = self._previous


def attach(loss, pairs) -> None:
    """Attaches to each gradient in ``pairs`` that needs it the squared norm one process's gradient would have."""
    if tf.executing_eagerly() or not isinstance(loss, (tf.Tensor, tf.Variable)) or not hasattr(loss, "graph"):
        return
    recorded = _lookups.get(loss.graph, [])
    attached, owners = _attached.setdefault(loss.graph, {}), _owners.setdefault(loss.graph, {})
    n = comm.world_size()
    for grad, var in pairs:
        if grad is None:
            continue
        info = shard_of(var)
        if isinstance(grad, tf.IndexedSlices):
            lookups = [lk for lk in recorded if lk.table is var]
            if lookups:
                attached[grad.values.ref()] = functools.partial(_sparse_square_norm, loss, var, lookups, n)
                owners[grad.values.ref()] = getattr(var, "name", "?")
        elif info is not None and not info.replicated and n > 1:
            dense = tf.convert_to_tensor(grad)
            attached[dense.ref()] = functools.partial(_allreduced_square_norm, dense)
            owners[dense.ref()] = getattr(var, "name", "?")


def carry(grad, averaged) -> None:
    """``averaged`` (``grad`` averaged over workers, a new tensor) carries the norm attached to ``grad``, if any.

    ``tf.gradients`` attaches its norms before ``apply_gradients`` averages, so a replicated variable's averaged
    gradient, clipped there (Keras' ``global_clipnorm``), must find the norm one process's would have.
    """
    old, new = (g.values if isinstance(g, tf.IndexedSlices) else g for g in (grad, averaged))
    if not _is_attached(old) or not hasattr(new, "graph"):
        return
    old = _attached_source(old)
    _attached.setdefault(new.graph, {})[new.ref()] = _attached[old.graph][old.ref()]
    _owners.setdefault(new.graph, {})[new.ref()] = _owners.get(old.graph, {}).get(old.ref(), "?")


def attaching(owner, attribute: str):
    """A replacement of ``owner.attribute`` (``tf.gradients``) that attaches to the gradients it returns the norms
    one process's would have (:func:`attach`), as ``compute_gradients`` does: Keras' ``global_clipnorm`` clips them
    inside ``apply_gradients``."""

    @functools.wraps(getattr(owner, attribute))
    def gradients(ys, xs, *args, **kwargs):
        variables = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        if any(isinstance(x, PackedTable) for x in variables):
            grads = _packed_gradients(patches.original(owner, attribute), ys, variables, *args, **kwargs)
        else:
            grads = patches.original(owner, attribute)(ys, xs, *args, **kwargs)
        losses = ys if isinstance(ys, (list, tuple)) else [ys]
        if len(losses) == 1 and len(variables) == len(grads):
            attach(losses[0], list(zip(grads, variables)))
        return grads

    return gradients


def _packed_gradients(original, ys, xs: List, *args, **kwargs) -> List:
    """``tf.gradients(ys, xs)`` where some of ``xs`` are packed tables: their group variables' gradients, split
    per table (each table's rows, offset back), as an unpacked table's gradient."""
    sources, at = [], {}
    for x in xs:
        source = x.group.variable if isinstance(x, PackedTable) else x
        if id(source) not in at:
            at[id(source)] = len(sources)
            sources.append(source)
    computed = original(ys, sources, *args, **kwargs)
    split = {}
    out = []
    for x in xs:
        if not isinstance(x, PackedTable):
            out.append(computed[at[id(x)]])
            continue
        group = x.group
        grad = computed[at[id(group.variable)]]
        if grad is not None and id(group) not in split:
            if not isinstance(grad, tf.IndexedSlices):
                dense = tf.convert_to_tensor(grad)
                grad = tf.IndexedSlices(dense, tf.range(tf.shape(dense, out_type=tf.int64)[0]),
                                        tf.shape(dense, out_type=tf.int64))
            split[id(group)] = dict(zip((id(t) for t in group.tables), group.split_gradient(grad)))
        out.append(None if grad is None else split[id(group)][id(x)])
    return out


def refuse_foreign_norms(pairs) -> None:
    """Raises ``ValueError`` if a gradient in ``pairs`` was clipped by TensorFlow's own global norm (one computed
    outside ``scope()``, where :func:`global_norm` is not installed) of a table's gradient that carries one
    process's norm: that norm sums this worker's slices only, so the workers would clip apart."""
    grads = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _ in pairs]
    grads = [g for g in grads if isinstance(g, tf.Tensor)]
    if tf.executing_eagerly() or not grads or not _attached.get(grads[0].graph):
        return
    owners = _owners.get(grads[0].graph, {})
    seen, stack = set(), [g.op for g in grads]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        source = _attached_source(op.inputs[0]) if op.type == "L2Loss" and "global_norm" in op.name else None
        if source is not None:
            name = owners.get(source.ref(), "?")
            raise ValueError(
                f"tf.clip_by_global_norm (tf.linalg.global_norm) ran outside the strategy's scope() over the "
                f"gradient of the table '{name}': TensorFlow's own global norm sums this worker's slices only, so "
                "the workers would clip apart from one process and from each other. Clip inside the scope: build "
                "compute_gradients, the clip and apply_gradients under strategy.scope() (hb.scope() for hb.train "
                "optimizers).")
        stack.extend(t.op for t in op.inputs)


def refuse_clipvalue(optimizer, pairs) -> None:
    """Raises ``ValueError`` if ``optimizer`` (a Keras optimizer) has ``clipvalue`` and a gradient in ``pairs`` is a
    table's: Keras clips it slice by slice, and a worker's slices of a table's gradient are cut apart from one
    process's (this worker's rows, one slice per distinct id of its own batch), so the clip would train apart from
    one process."""
    if getattr(optimizer, "clipvalue", None) is None:
        return
    for grad, var in pairs:
        if grad is None:
            continue
        info = shard_of(var)
        if _is_attached(grad) or (info is not None and not info.replicated):
            raise ValueError(
                f"The Keras optimizer's clipvalue={optimizer.clipvalue} would clip the gradient of the table "
                f"'{getattr(var, 'name', '?')}' slice by slice, and a worker's slices of a table's gradient are cut "
                "apart from one process's: the workers would train apart from one process. Use clipnorm or "
                "global_clipnorm (one process's norm), or clip the averaged, densified gradients of "
                "compute_gradients (tf.clip_by_value(tf.convert_to_tensor(grad), ...)) before apply_gradients.")


def _allreduced_square_norm(dense: tf.Tensor) -> tf.Tensor:
    return comm.allreduce(tf.reduce_sum(tf.square(tf.cast(dense, tf.float32))), "sum")


def _sparse_square_norm(loss, var, lookups: List[_Lookup], n: int) -> tf.Tensor:
    info = shard_of(var)
    upstream = patches.original(tf, "gradients")(loss, [lk.output for lk in lookups])
    summed: List[tf.Tensor] = []   # this worker's share of a sum over workers
    whole: List[tf.Tensor] = []    # already the sum over workers
    for lk, grad in zip(lookups, upstream):
        if grad is None:
            continue
        grad = tf.cast(tf.convert_to_tensor(grad), tf.float32)
        if lk.kind == OCCURRENCE:  # one process's slice per id: this worker's, scaled to the global mean
            summed.append(tf.reduce_sum(tf.square(grad / n)))
            continue
        rows = _table_gradient_of(lk, grad, var)
        if rows is None:
            continue
        values = tf.cast(rows.values, tf.float32)
        if info is None:  # a replicated variable: this worker's rows of its own batch, averaged over workers
            dense = tf.math.unsorted_segment_sum(values, rows.indices, tf.shape(var, out_type=rows.indices.dtype)[0])
            dense = comm.allreduce(dense, "sum") / n if n > 1 else dense
            whole.append(tf.reduce_sum(tf.square(dense)))
            continue
        distinct, at = tf.unique(rows.indices)
        per_row = tf.math.unsorted_segment_sum(values, at, tf.shape(distinct)[0])
        (whole if info.replicated else summed).append(tf.reduce_sum(tf.square(per_row)))
    total = tf.add_n(summed) if summed else tf.constant(0.0)
    if n > 1 and summed:
        total = comm.allreduce(total, "sum")
    return total + tf.add_n(whole) if whole else total


def _table_gradient_of(lookup: _Lookup, upstream: tf.Tensor, var) -> Optional[tf.IndexedSlices]:
    """This lookup's own gradient at ``var`` (through the exchange, as the step's), as slices."""
    surrogate = tf.reduce_sum(tf.cast(lookup.output, tf.float32) * tf.stop_gradient(upstream))
    source = var.group.variable if isinstance(var, PackedTable) else var  # its rows only: this lookup reads no other
    [grad] = patches.original(tf, "gradients")(surrogate, [source])
    if grad is None:
        return None
    if not isinstance(grad, tf.IndexedSlices):
        dense = tf.convert_to_tensor(grad)
        grad = tf.IndexedSlices(dense, tf.range(tf.shape(dense, out_type=tf.int64)[0]), tf.shape(dense))
    return grad


def _square_norm(t) -> tf.Tensor:
    values = t.values if isinstance(t, tf.IndexedSlices) else t
    values = tf.convert_to_tensor(values)
    source = _attached_source(values)
    if source is not None:
        attached = _attached[source.graph]
        if callable(attached[source.ref()]):  # built the first time a norm asks, so unused norms cost nothing
            with source.graph.as_default():
                attached[source.ref()] = attached[source.ref()]()
        return attached[source.ref()]
    return tf.reduce_sum(tf.square(tf.cast(values, tf.float32)))


def global_norm(t_list, name=None):
    """``tf.linalg.global_norm`` in which gradients of tables count as one process's gradient does."""
    original = patches.original(clip_ops, "global_norm")
    tensors = [t for t in t_list if t is not None]
    if tf.executing_eagerly() or not any(_is_attached(t) for t in tensors):
        return original(t_list, name=name)
    with tf.name_scope(name or "global_norm"):
        dtype = (tensors[0].values if isinstance(tensors[0], tf.IndexedSlices) else tensors[0]).dtype
        total = tf.add_n([_square_norm(t) for t in tensors])
        return tf.cast(tf.sqrt(total), dtype.base_dtype)


def clip_by_norm(t, clip_norm, axes=None, name=None):
    """``tf.clip_by_norm`` in which the norm of a table's gradient is one process's (Keras' ``clipnorm`` calls it).

    A sharded table's gradient holds this worker's rows only. The clip is one
    factor, the same on every worker, so it also commutes with averaging: a
    replicated variable's gradient of ``tf.gradients`` (not averaged yet) is
    clipped as its average would be. The clipped gradient carries its clipped
    norm.
    """
    original = patches.original(clip_ops, "clip_by_norm")
    if tf.executing_eagerly() or axes is not None or not _is_attached(t):
        return original(t, clip_norm, axes=axes, name=name)
    with tf.name_scope(name or "clip_by_norm"):
        values = tf.convert_to_tensor(t.values if isinstance(t, tf.IndexedSlices) else t)
        square = _square_norm(t)
        clip = tf.cast(clip_norm, tf.float32)
        factor = clip / tf.maximum(tf.sqrt(square), clip)  # TensorFlow's: values * clip / max(norm, clip)
        clipped = values * tf.cast(factor, values.dtype)
        _attached.setdefault(clipped.graph, {})[clipped.ref()] = square * tf.square(factor)
        source = _attached_source(values)
        _owners.setdefault(clipped.graph, {})[clipped.ref()] = _owners.get(source.graph, {}).get(source.ref(), "?")
    if isinstance(t, tf.IndexedSlices):
        return tf.IndexedSlices(clipped, t.indices, t.dense_shape)
    return clipped


def _is_attached(t) -> bool:
    values = t.values if isinstance(t, tf.IndexedSlices) else t
    return isinstance(values, tf.Tensor) and _attached_source(values) is not None


def _attached_source(values) -> Optional[tf.Tensor]:
    """``values``, or the tensor it passes on unchanged through identities, that carries a norm; else None.

    Keras' legacy ``apply_gradients`` sums gradients over replicas (one, outside a ``tf.distribute`` strategy);
    when none of them is ``IndexedSlices``, that sum is a ``custom_gradient`` which returns each gradient through
    one ``IdentityN``: a table's dense gradient (a regularizer made it dense) reached ``global_clipnorm`` as a new
    tensor, its norm lost.
    """
    if not hasattr(values, "graph") or not isinstance(values, tf.Tensor):
        return None
    attached = _attached.get(values.graph, {})
    while values.ref() not in attached:
        if values.op.type == "Identity":
            values = values.op.inputs[0]
        elif values.op.type == "IdentityN":
            values = values.op.inputs[values.value_index]
        else:
            return None
    return values
