"""The delta store of a SavedModel version: ``variables/delta-<k>`` bundles that its own restore op applies.

A version collective writes restores in two parts, both TensorFlow ops in
the SavedModel (so TF Serving, ``tf.compat.v1.saved_model.load`` and
``saved_model_cli`` run them without this package):

1. the ordinary restore of ``variables/variables`` (whole tables, as exported);
2. every ``variables/delta-000001``, ``delta-000002``, ... in order (as many
   as the folder holds: ``MatchingFiles`` counts them), each a V2 bundle
   holding, for every served table ``<table>``, ``<table>/keys`` ``[K]``
   int64 and ``<table>`` ``[K, dim]`` (a hash table also
   ``<table>/tombstones`` ``[T]``, the keys evicted), and every other served
   variable whole. A fixed table's rows are written over by logical row id;
   a hash table first drops its evicted keys from its ``tf.lookup`` key ->
   row table (they read the default row again), then its known keys get
   their rows written over and new keys are appended as new rows and
   inserted into that table; the other variables take the bundle's values.

A full export writes no delta. A serving update
(:mod:`.serving_update`) links the files of the version it starts from into
the new version and writes one more delta, so a version costs the rows that
changed, not the tables. :class:`Served` describes what a version serves
(it goes into the version's record, :mod:`.serving_versions`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Dict, List, Mapping, Tuple

import numpy as np
import tensorflow as tf

VARIABLES = "variables"
DELTA = "delta-"
WIDTH = 6


def tombstones_key(name: str) -> str:
    """Where a delta stores the keys of hash table ``name`` evicted since the version before (``[T]`` int64)."""
    return f"{name}/tombstones"


def delta_prefix(version_dir: str, number: int) -> str:
    """The prefix of the ``number``-th delta (from 1) of a version."""
    return os.path.join(version_dir, VARIABLES, f"{DELTA}{number:0{WIDTH}d}")


def delta_numbers(version_dir: str) -> List[int]:
    """The numbers of the deltas a version holds (its ``variables/delta-<k>.index`` files), ascending."""
    found = tf.io.gfile.glob(os.path.join(version_dir, VARIABLES, f"{DELTA}*.index"))
    return sorted(int(m.group(1)) for m in (re.search(rf"{DELTA}(\d+)\.index$", f) for f in found) if m)


@dataclasses.dataclass
class Served:
    """What a version serves: its tables (``fixed`` by row id, ``hash`` by key) and its other variables.

    ``fixed``: ``{name: (rows, dim, dtype)}``; ``hash``: ``{name: (dim, dtype)}``;
    ``dense``: ``{name: (shape, dtype)}``.
    """

    fixed: Dict[str, Tuple[int, int, str]]
    hash: Dict[str, Tuple[int, str]]
    dense: Dict[str, Tuple[List[int], str]]

    def to_json(self) -> Dict:
        return {"fixed": {k: list(v) for k, v in self.fixed.items()},
                "hash": {k: list(v) for k, v in self.hash.items()},
                "dense": {k: [list(v[0]), v[1]] for k, v in self.dense.items()}}

    @classmethod
    def from_json(cls, data: Mapping) -> "Served":
        return cls({k: tuple(v) for k, v in data["fixed"].items()}, {k: tuple(v) for k, v in data["hash"].items()},
                   {k: (list(v[0]), v[1]) for k, v in data["dense"].items()})


def _name(var) -> str:
    return var.op.name


def add_delta_restore(saver, table_names: List[str], hash_indexes: Mapping[str, object]) -> Served:
    """Makes ``saver``'s restore op (the SavedModel's) also apply the version's deltas; returns what it serves.

    ``saver`` saves the export graph's variables (the SavedModel builder's
    saver); ``table_names`` are its fixed tables (the checkpoint keys of
    sharded tables), ``hash_indexes`` its hash tables' key -> row lookup
    tables by table name. Every other global variable is served whole from
    each delta.
    """
    graph = tf.compat.v1.get_default_graph()
    variables = {_name(v): v for v in tf.compat.v1.global_variables()}
    fixed = {name: variables[name] for name in table_names if name in variables}
    hashed = {name: (variables[name], index) for name, index in hash_indexes.items() if name in variables}
    dense = {name: var for name, var in variables.items() if name not in fixed and name not in hashed}
    if saver.saver_def is None:  # nothing to save: nothing to update either
        return Served({}, {}, {})
    restore = graph.get_operation_by_name(saver.saver_def.restore_op_name)
    filename = graph.get_tensor_by_name(saver.saver_def.filename_tensor_name)
    with tf.name_scope("restore_deltas"), tf.control_dependencies([restore]):
        folder = tf.strings.regex_replace(filename, "[^/]*$", "")  # .../variables/
        count = tf.size(tf.io.matching_files(tf.strings.join([folder, f"{DELTA}*.index"])))

        def body(i):
            prefix = tf.strings.join([folder, DELTA, tf.strings.as_string(i + 1, width=WIDTH, fill="0")])
            applied = [_apply_fixed(prefix, name, var) for name, var in fixed.items()]
            applied += [_apply_hash(prefix, name, var, index) for name, (var, index) in hashed.items()]
            applied += [_apply_dense(prefix, name, var) for name, var in dense.items()]
            with tf.control_dependencies(applied):
                return i + 1

        done = tf.while_loop(lambda i: i < count, body, [tf.constant(0)], parallel_iterations=1)
        restore_all = tf.group(done, name="restore_all_with_deltas")
    saver.saver_def.restore_op_name = restore_all.name
    return Served({n: (int(v.shape[0]), int(v.shape[1]), v.dtype.base_dtype.name) for n, v in fixed.items()},
                  {n: (int(v.shape[1]), v.dtype.base_dtype.name) for n, (v, _) in hashed.items()},
                  {n: (v.shape.as_list(), v.dtype.base_dtype.name) for n, v in dense.items()})


def _read_rows(prefix: tf.Tensor, name: str, var) -> Tuple[tf.Tensor, tf.Tensor]:
    keys, rows = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[f"{name}/keys", name], shape_and_slices=["", ""],
                                      dtypes=[tf.int64, var.dtype.base_dtype])
    return tf.reshape(keys, [-1]), tf.reshape(rows, [-1, int(var.shape[1])])


def _apply_fixed(prefix: tf.Tensor, name: str, var) -> tf.Operation:
    keys, rows = _read_rows(prefix, name, var)
    return tf.compat.v1.scatter_update(var, keys, rows).op


def _apply_hash(prefix: tf.Tensor, name: str, var, index) -> tf.Operation:
    evicted = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[tombstones_key(name)], shape_and_slices=[""],
                                   dtypes=[tf.int64])[0]
    with tf.control_dependencies([index.remove(tf.reshape(evicted, [-1]))]):
        keys, rows = _read_rows(prefix, name, var)
        found = index.lookup(keys)
    known = found >= 0
    update = tf.compat.v1.scatter_update(var, tf.boolean_mask(found, known), tf.boolean_mask(rows, known))
    with tf.control_dependencies([update.op]):
        held = var.read_value()
        new_keys = tf.boolean_mask(keys, ~known)
        new_rows = tf.shape(held, out_type=tf.int64)[0] + tf.range(tf.size(new_keys, out_type=tf.int64))
        grown = _assign(var, tf.concat([held, tf.boolean_mask(rows, ~known)], 0))
        inserted = index.insert(new_keys, new_rows)
    return tf.group(grown, inserted)


def _apply_dense(prefix: tf.Tensor, name: str, var) -> tf.Operation:
    value = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name], shape_and_slices=[""],
                                 dtypes=[var.dtype.base_dtype])[0]
    return _assign(var, value)


def _assign(var, value: tf.Tensor) -> tf.Operation:
    """``var = value`` whatever the variable's kind (a resource variable, or a ``RefVariable`` under TF1 behaviour)
    and whatever ``value``'s shape (a hash table grows)."""
    return tf.compat.v1.assign(var, value, validate_shape=False).op


def write_delta(prefix: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Writes ``tensors`` as one V2 bundle at ``prefix`` with TensorFlow's ``SaveV2``, in a graph of its own."""
    names = sorted(tensors)
    with tf.Graph().as_default():
        placeholders = [tf.compat.v1.placeholder(tf.as_dtype(tensors[n].dtype), tensors[n].shape) for n in names]
        save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                                 tensors=placeholders)
        with tf.compat.v1.Session() as sess:
            sess.run(save, dict(zip(placeholders, (tensors[n] for n in names))))


def link_or_copy(source: str, destination: str) -> None:
    """A hard link of ``source`` at ``destination`` (no bytes copied), or a copy where links cannot be made."""
    if "://" not in source and "://" not in destination:
        try:
            os.link(source, destination)
            return
        except OSError:
            pass
    tf.io.gfile.copy(source, destination, overwrite=True)

