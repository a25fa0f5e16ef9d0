"""Warm starts of sharded tables: ``init_from_checkpoint`` and ``warm_start_from`` load a table's logical rows.

Inside ``CollectiveStrategy.scope()`` TensorFlow's ``init_from_checkpoint``
(which Estimator's ``warm_start_from`` calls too) sets a variable's
initializer to the tensor it reads from a checkpoint. A sharded table's
variable holds only this worker's rows, so the stored tensor, a whole
``[vocab, dim]`` table in a plain TensorFlow checkpoint or in a logical one
written by ``collective.checkpoint.Saver``, is read and this worker's rows of
it are kept (:func:`set_checkpoint_initializer`). A one-to-one mapping onto a
sharded table is checked against the table's logical shape, not its shard's
(:func:`init_from_checkpoint`).
"""

from __future__ import annotations

from collections import abc
from typing import List, Tuple

import tensorflow as tf

from collective.embedding import packed_tables
from collective.embedding.packed_group import PackedTable
from collective.embedding.table import shard_of
from collective.tf_internals import checkpoint_utils, io_ops, patches, set_initializer, warm_starting_util


def _table(target):
    """The sharded table ``target`` (a variable, a packed table alone in a list as ``warm_start`` passes it, or a
    variable-store name) stands for, else None."""
    if isinstance(target, (list, tuple)) and len(target) == 1 and isinstance(target[0], PackedTable):
        target = target[0]
    if isinstance(target, str):
        target = _stored(target)
    return target if target is not None and shard_of(target) is not None else None


def _stored(name: str):
    """The variable (or packed table) ``get_variable`` made under ``name`` in the default graph, else None."""
    packed = packed_tables.existing(name)
    if packed is not None:
        return packed
    store = tf.compat.v1.get_default_graph().get_collection_ref(("__variable_store",))
    return store[0]._vars.get(name) if store else None  # pylint: disable=protected-access


def _packed_in_scope(tensor_scope: str, scope: str) -> List[Tuple[str, PackedTable]]:
    """``(stored tensor name, packed table)`` of a scope mapping ``{tensor_scope: scope}`` (``{"/": "/"}``: every
    table): the packed tables, which the variable store does not hold, under ``scope``."""
    tensor_scope, scope = ("" if s == "/" else s for s in (tensor_scope, scope))
    return [(tensor_scope + t.name[len(scope):], t) for t in packed_tables.made_tables()
            if t.name.startswith(scope)]


def _load_rows(table, ckpt_file: str, tensor_name: str) -> None:
    """Sets ``table``'s initializer to its rows of the logical tensor ``tensor_name`` of ``ckpt_file``.

    Refused before any op is built: a hash-table vocabulary, and a stored
    tensor whose shape is not the table's logical shape.
    """
    info = shard_of(table)
    if info.hash_index is not None:
        raise ValueError(f"init_from_checkpoint / warm_start_from cannot load the hash-table vocabulary "
                         f"'{info.name}': its rows are keyed, not positioned. Restore it with "
                         "collective.checkpoint.Saver (or a resumed model_dir) instead")
    stored = checkpoint_utils.load_checkpoint(ckpt_file).get_variable_to_shape_map().get(tensor_name)
    if stored is None or list(stored) != list(info.logical_shape):
        raise ValueError(f"cannot warm-start the sharded table '{info.name}' {list(info.logical_shape)} from "
                         f"'{tensor_name}' of shape {stored} in {ckpt_file}: the stored tensor must be the whole "
                         "table (a checkpoint of the same vocabulary and dimension)")
    with tf.device("/cpu:0"):
        whole = io_ops.restore_v2(ckpt_file, [tensor_name], [""], [table.dtype.base_dtype],
                                  name="checkpoint_initializer")[0]
    rows = info.layout.local_part(whole)
    rows.set_shape(table.shape)
    if isinstance(table, PackedTable):
        packed_tables.set_initial(table, rows)
        return
    set_initializer(table, table.assign(rows, read_value=False))
    table._initial_value = rows  # pylint: disable=protected-access


def set_checkpoint_initializer(variable, ckpt_file, tensor_name, slice_spec, name="checkpoint_initializer"):
    """``checkpoint_utils._set_checkpoint_initializer``: a sharded table loads its rows of the stored table."""
    if shard_of(variable) is not None and not slice_spec:
        _load_rows(variable, ckpt_file, tensor_name)
        return
    patches.original(checkpoint_utils, "_set_checkpoint_initializer")(variable, ckpt_file, tensor_name,
                                                                      slice_spec, name=name)


def init_from_checkpoint(ckpt_dir_or_file, assignment_map):
    """``checkpoint_utils._init_from_checkpoint``: one-to-one mappings onto sharded tables load their rows.

    TensorFlow checks such a mapping against the variable's shape (the
    shard's here); the stored tensor must have the table's logical shape.
    Scope mappings (``{"/": "/"}``) reach :func:`set_checkpoint_initializer`.
    """
    pairs = list(assignment_map.items() if isinstance(assignment_map, abc.Mapping) else assignment_map)
    pairs += [pair for tensor_name, target in list(pairs)
              if isinstance(target, str) and target.endswith("/") and isinstance(tensor_name, str)
              for pair in _packed_in_scope(tensor_name, target)]
    rest = []
    for tensor_name, target in pairs:
        table = None if isinstance(target, str) and target.endswith("/") else _table(target)
        if table is None:
            rest.append((tensor_name, target))
            continue
        reader = checkpoint_utils.load_checkpoint(ckpt_dir_or_file)
        if not reader.has_tensor(tensor_name):
            raise ValueError(f"Tensor {tensor_name} is not found in checkpoint {ckpt_dir_or_file} (warm start of the "
                             f"sharded table '{shard_of(table).name}')")
        _load_rows(table, checkpoint_utils._get_checkpoint_filename(ckpt_dir_or_file),  # pylint: disable=protected-access
                   tensor_name)
    if rest or not pairs:
        patches.original(checkpoint_utils, "_init_from_checkpoint")(ckpt_dir_or_file, rest)


def grouped_variables(vars_to_warm_start):
    """``warm_starting_util._get_grouped_variables``: the variables ``warm_start`` (and Estimator's
    ``warm_start_from``) loads, with packed tables where the request names them (a pattern over the trainable
    variables, names, or the tables themselves) and no group variable (collective's own)."""
    packed: List[PackedTable] = []
    request = vars_to_warm_start
    if isinstance(request, list) and any(isinstance(v, PackedTable) for v in request):
        packed = [v for v in request if isinstance(v, PackedTable)]
        request = [v for v in request if not isinstance(v, PackedTable)]
    if isinstance(request, str) or request is None:
        patterns = [request]
    elif isinstance(request, list) and request and all(isinstance(v, str) for v in request):
        patterns = request
    else:
        patterns = []
    for pattern in patterns:
        packed += packed_tables.made_tables(pattern)
    grouped = patches.original(warm_starting_util, "_get_grouped_variables")(request) if request != [] else {}
    grouped = {name: group for name, group in grouped.items()
               if not any(packed_tables.group_of(v) is not None for v in group)}
    for table in packed:
        grouped.setdefault(table.name, [table])
    return grouped


def infer_var_name(var) -> str:
    """``warm_starting_util._infer_var_name``: a packed table (alone in nested lists, as ``warm_start`` passes
    it) is named by its own name."""
    item = var
    while isinstance(item, (list, tuple)) and len(item) == 1:
        item = item[0]
    if isinstance(item, PackedTable):
        return item.name
    return patches.original(warm_starting_util, "_infer_var_name")(var)
