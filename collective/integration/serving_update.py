"""Serving updates: a new SavedModel version from the last one plus the deltas of an incremental checkpoint chain.

    export_saved_model(export_dir_base, "model_dir/model.ckpt-1000", signature_def_fn)    # version 1, full
    ...  # training goes on; saver.save_incremental(...) or IncrementalSaverHook writes deltas
    update_saved_model(export_dir_base, latest_incremental_checkpoint("model_dir"))       # version 2, in seconds

No table is gathered from the workers and no model is rebuilt: the newest
version under ``export_dir_base`` is copied (graph, assets, assets.extra as
they are) into a new version folder whose variables bundle is written anew
from the old one:

- a fixed table's rows that a delta holds are written over, by logical row id;
- a hash-table vocabulary's keys the version holds get their rows written
  over (their row in its ``tf.lookup`` key -> row table); new keys are
  appended as new rows and added to the lookup table;
- every other variable that the last delta holds (dense layers, the global
  step) is replaced by the delta's value; the rest is copied as it is.

Deltas are applied oldest first, so a row takes the value of the newest
delta that holds it; optimizer slots in the deltas are not served and not
read. Which deltas apply comes from the version's record
(:mod:`.serving_versions`): the chain must start from the version's full
checkpoint and contain the version's deltas. The new folder is written as
``temp-<version>`` and renamed into place, so a model server polling the
base (TF Serving, or a plain TensorFlow process taking the largest number)
sees a complete version or none. The new version number is larger than the
last one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import manifest
from collective.integration import serving_versions
from collective.integration.serving_versions import ServingUpdateError
from collective.runtime import heartbeat
from collective.tf_internals import compat

logger = logging.getLogger("collective.integration.serving_update")

VARIABLES = os.path.join("variables", "variables")


@dataclasses.dataclass
class _Tensor:
    """How one tensor of the new bundle is made: read from ``source``, rows overwritten, rows appended."""

    dtype: tf.DType
    source: str
    rows: Optional[np.ndarray] = None  # [R] rows of the source tensor to overwrite ...
    values: Optional[np.ndarray] = None  # ... with these [R, ...]
    appended: Optional[np.ndarray] = None  # [A, ...] rows added at the end


def update_saved_model(export_dir_base, chain_end, version: Optional[int] = None) -> Optional[bytes]:
    """Writes a new SavedModel version: ``version`` (default: the newest) with the deltas of ``chain_end`` applied.

    Args:
      export_dir_base: the folder of the versions (what ``export_saved_model`` was given).
      chain_end: an incremental checkpoint prefix (``.../model.ckpt-<step>.delta``), or a model_dir
        (its :func:`~collective.checkpoint.latest_incremental_checkpoint`).
      version: the version to start from; by default the newest one.

    Returns:
      On rank 0 the new version's folder (bytes, as ``export_saved_model``);
      ``None`` on other workers, which return at once. Needs no collective:
      any process may call it (a job that pushes models, say), as rank 0.

    Raises:
      ServingUpdateError: no version to start from, or the chain does not
        continue it (another base, a gap, other deltas, nothing newer); the
        message names the version and the delta.
      ChainError: a delta of the chain is missing or torn.
    """
    if comm.rank() != 0:
        logger.info("serving update: rank %d leaves the SavedModel to rank 0", comm.rank())
        return None
    with heartbeat.phase("export"):
        return _update(_path(export_dir_base), _path(chain_end), version)


def _update(export_dir_base: str, chain_end: str, version: Optional[int]) -> bytes:
    started = time.monotonic()
    if tf.io.gfile.isdir(chain_end):
        found = manifest.latest_incremental_checkpoint(chain_end)
        if found is None:
            raise ServingUpdateError(f"serving update: no checkpoint in {chain_end}")
        chain_end = found
    chain = manifest.verify_chain(chain_end)
    existing = serving_versions.versions(export_dir_base)
    if not existing:
        raise ServingUpdateError(f"serving update: no SavedModel version under {export_dir_base} to update; export "
                                 "one first with export_saved_model (a full export)")
    if version is None:
        version = existing[-1]
    elif version not in existing:
        raise ServingUpdateError(f"serving update: no SavedModel version {version} under {export_dir_base} "
                                 f"(versions: {existing})")
    old_dir = os.path.join(export_dir_base, str(version))
    record = serving_versions.read_record(old_dir)
    deltas = serving_versions.deltas_to_apply(record, old_dir, chain)
    plan = _plan(os.path.join(old_dir, VARIABLES), old_dir, record, chain.base, deltas)
    new_version = serving_versions.next_version(export_dir_base)
    new_dir = os.path.join(export_dir_base, str(new_version))
    temp_dir = os.path.join(export_dir_base, f"temp-{new_version}")
    if tf.io.gfile.exists(temp_dir):
        tf.io.gfile.rmtree(temp_dir)
    _copy_version(old_dir, temp_dir)
    _write_bundle(os.path.join(temp_dir, VARIABLES), plan)
    serving_versions.write_record(temp_dir, serving_versions.updated_record(record, version, deltas))
    tf.io.gfile.rename(temp_dir, new_dir)
    logger.info("serving update: version %d = version %d + %d delta(s) up to %s, written to %s in %.1f s",
                new_version, version, len(deltas), chain_end, new_dir, time.monotonic() - started)
    return new_dir.encode()


def _plan(old_prefix: str, old_dir: str, record: Dict, base: str, deltas: List[str]) -> Dict[str, _Tensor]:
    """Every tensor of the new bundle: where it is read from and which rows change."""
    reader = tf.compat.v1.train.NewCheckpointReader(old_prefix)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    plan = {key: _Tensor(dtypes[key], old_prefix) for key in shapes}
    tables = sorted({name for delta in deltas for name in manifest.read_manifest(delta)["rows"]})
    base_reader = tf.compat.v1.train.NewCheckpointReader(base)
    hash_tables = {name for name in tables if base_reader.has_tensor(f"{name}/keys")}  # a full save stores its keys
    readers = {delta: tf.compat.v1.train.NewCheckpointReader(delta) for delta in deltas}
    last = readers[deltas[-1]]
    row_keys = {f"{name}/keys" for name in tables}
    for key in shapes:  # replicated variables: the last delta holds them whole
        if key in tables or key in row_keys or not last.has_tensor(key):
            continue
        have = list(last.get_variable_to_shape_map()[key])
        if have != list(shapes[key]) or last.get_variable_to_dtype_map()[key] != dtypes[key]:
            raise ServingUpdateError(
                f"serving update: variable {key!r} is {_describe(dtypes[key], shapes[key])} in SavedModel version "
                f"{old_dir} but {_describe(last.get_variable_to_dtype_map()[key], have)} in {deltas[-1]}: the "
                "version was not exported from this model's checkpoints")
        plan[key] = _Tensor(dtypes[key], deltas[-1])
    for name in tables:
        if name not in shapes:
            logger.info("serving update: table %s is not in version %s's graph; its rows are not served", name,
                        old_dir)
            continue
        keys, values = _changed_rows(readers, name, dtypes[name], shapes[name][1:], old_dir)
        if not keys.size:
            continue
        if name in hash_tables:
            _plan_hash_table(plan, reader, record, name, keys, values, old_dir)
        else:
            _plan_fixed_table(plan[name], shapes[name], name, keys, values, old_dir, deltas)
    return plan


def _changed_rows(readers: Dict[str, object], name: str, dtype: tf.DType, row_shape, old_dir: str):
    """``(keys, rows)`` of table ``name`` over the deltas ``readers`` reads (oldest first): each key once, with its
    newest row."""
    keys, values = [], []
    for delta, reader in readers.items():
        if not reader.has_tensor(f"{name}/keys"):  # no row of it changed in this delta
            continue
        have = reader.get_variable_to_shape_map()[name]
        if list(have[1:]) != list(row_shape) or reader.get_variable_to_dtype_map()[name] != dtype:
            raise ServingUpdateError(
                f"serving update: table {name!r} has rows of {_describe(dtype, row_shape)} in SavedModel version "
                f"{old_dir} but {_describe(reader.get_variable_to_dtype_map()[name], have[1:])} in {delta}: the "
                "version was not exported from this model's checkpoints")
        keys.append(reader.get_tensor(f"{name}/keys"))
        values.append(reader.get_tensor(name))
    if not keys:
        return np.zeros([0], np.int64), None
    keys, values = np.concatenate(keys), np.concatenate(values)
    # The last occurrence of each key is its newest row: the first one in the reversed order.
    _, first = np.unique(keys[::-1], return_index=True)
    newest = len(keys) - 1 - first
    return keys[newest], values[newest]


def _plan_fixed_table(tensor: _Tensor, shape, name: str, keys: np.ndarray, values: np.ndarray, old_dir: str,
                      deltas: List[str]) -> None:
    if keys.min() < 0 or keys.max() >= shape[0]:
        raise ServingUpdateError(
            f"serving update: the deltas {[os.path.basename(d) for d in deltas]} hold rows up to {keys.max()} of "
            f"table {name!r}, which has {shape[0]} rows in SavedModel version {old_dir}: the version was not "
            "exported from this model's checkpoints")
    tensor.rows, tensor.values = keys, values


def _plan_hash_table(plan: Dict[str, _Tensor], reader, record: Dict, name: str, keys: np.ndarray,
                     values: np.ndarray, old_dir: str) -> None:
    """Known keys: their rows overwritten; new keys: rows appended to the values and to the lookup table."""
    lookup = record.get("hash_tables", {}).get(name)
    if lookup is None or not (reader.has_tensor(lookup["keys"]) and reader.has_tensor(lookup["rows"])):
        raise ServingUpdateError(
            f"serving update: SavedModel version {old_dir} holds the hash-table vocabulary {name!r} but not its "
            "key -> row lookup table under the names its record gives; export a full version again")
    held_keys = reader.get_tensor(lookup["keys"]).astype(np.int64)
    held_rows = reader.get_tensor(lookup["rows"]).astype(np.int64)
    order = np.argsort(held_keys)
    at = np.searchsorted(held_keys[order], keys)
    at = np.minimum(at, max(len(order) - 1, 0))
    known = (held_keys[order][at] == keys) if len(order) else np.zeros(len(keys), bool)
    rows_now = int(reader.get_variable_to_shape_map()[name][0])
    new_keys = keys[~known]
    new_rows = np.arange(rows_now, rows_now + len(new_keys), dtype=np.int64)
    values_tensor = plan[name]
    values_tensor.rows, values_tensor.values = held_rows[order][at[known]], values[known]
    values_tensor.appended = values[~known]
    plan[lookup["keys"]].appended = new_keys.astype(plan[lookup["keys"]].dtype.as_numpy_dtype)
    plan[lookup["rows"]].appended = new_rows.astype(plan[lookup["rows"]].dtype.as_numpy_dtype)


def _write_bundle(prefix: str, plan: Dict[str, _Tensor]) -> None:
    """Writes the tensors of ``plan`` as one V2 bundle at ``prefix`` with TensorFlow's own ops, in a graph of its own
    (whatever mode the caller's TensorFlow is in)."""
    names = sorted(plan)
    feed = {}
    with tf.Graph().as_default():
        tensors = []
        for name in names:
            spec = plan[name]
            tensor = tf.raw_ops.RestoreV2(prefix=spec.source, tensor_names=[name], shape_and_slices=[""],
                                          dtypes=[spec.dtype])[0]
            if spec.rows is not None and spec.rows.size:
                rows = tf.compat.v1.placeholder(tf.int64, [None])
                values = tf.compat.v1.placeholder(spec.dtype, spec.values.shape)
                tensor = tf.tensor_scatter_nd_update(tensor, rows[:, None], values)
                feed[rows], feed[values] = spec.rows, spec.values
            if spec.appended is not None and spec.appended.size:
                appended = tf.compat.v1.placeholder(spec.dtype, spec.appended.shape)
                tensor = tf.concat([tensor, appended], axis=0)
                feed[appended] = spec.appended
            tensors.append(tensor)
        save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                                 tensors=tensors)
        tf.io.gfile.makedirs(os.path.dirname(prefix))
        with tf.compat.v1.Session() as sess:
            sess.run(save, feed)


def _copy_version(old_dir: str, new_dir: str) -> None:
    """Copies every file of version ``old_dir`` but its variables bundle (written anew) and its record."""
    skip = {os.path.normpath(os.path.join(old_dir, serving_versions.RECORD))}
    bundle = os.path.normpath(os.path.join(old_dir, VARIABLES))
    for folder, _, files in tf.io.gfile.walk(old_dir):
        target = os.path.join(new_dir, os.path.relpath(folder, old_dir))
        tf.io.gfile.makedirs(target)
        for name in files:
            source = os.path.normpath(os.path.join(folder, name))
            if source in skip or source.startswith(bundle + "."):
                continue
            tf.io.gfile.copy(source, os.path.join(target, name), overwrite=True)


def _describe(dtype, shape) -> str:
    return f"{tf.as_dtype(dtype).name} [{', '.join(str(d) for d in shape)}]"


def _path(path) -> str:
    return compat.as_text(os.fspath(path))
