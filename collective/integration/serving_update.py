"""Serving updates: a new SavedModel version from the last one plus the deltas of an incremental checkpoint chain.

    export_saved_model(export_dir_base, "model_dir/model.ckpt-1000", signature_def_fn)    # version 1, full
    ...  # training goes on; saver.save_incremental(...) or IncrementalSaverHook writes deltas
    update_saved_model(export_dir_base, latest_incremental_checkpoint("model_dir"))       # version 2, in seconds

No table is gathered from the workers, no model is rebuilt and no table is
rewritten: the newest version under ``export_dir_base`` is copied into a
new version folder (``saved_model.pb``, ``assets/`` and ``assets.extra/``
copied; its variables bundle and its deltas hard-linked, so not one byte of
them is written), and one more delta (:mod:`.serving_deltas`) is written
with what the chain's new deltas hold: for each served table its changed
rows, newest first wins (logical row ids of a fixed table, keys of a hash
table), and every other served variable (dense layers, the global step) as
the last delta holds it, and each hash table's keys evicted (the chain's
tombstones, unless a later delta holds the key again). Optimizer slots in
the chain are not read. The version's own restore op applies its deltas
when a model server loads it.

Which deltas of the chain apply comes from the version's record
(:mod:`.serving_versions`): the chain must start from the version's full
checkpoint and contain the version's deltas. The new folder is written as
``temp-<version>`` and renamed into place, so a model server polling the
base (TF Serving, or a plain TensorFlow process taking the largest number)
sees a complete version or none. The new version number is larger than the
last one.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import hash_tables, incremental, manifest
from collective.integration import serving_deltas, serving_versions
from collective.integration.serving_versions import ServingUpdateError
from collective.runtime import heartbeat
from collective.tf_internals import compat

logger = logging.getLogger("collective.integration.serving_update")


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
        continue it (another base, a gap, other deltas, nothing newer), or
        its tables do not match the version's; the message names the
        version and the delta.
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
    # The base and the deltas the version holds are not read again: their files are checked by size, not checksum.
    chain = manifest.verify_chain(chain_end, trusted=[os.path.basename(record["base"]["prefix"])] + [
        entry["prefix"] for entry in record["deltas"]])
    deltas = serving_versions.deltas_to_apply(record, old_dir, chain)
    served = serving_deltas.Served.from_json(record["served"])
    tensors = _delta_tensors(served, deltas, old_dir)
    new_version = serving_versions.next_version(export_dir_base)
    new_dir = os.path.join(export_dir_base, str(new_version))
    temp_dir = os.path.join(export_dir_base, f"temp-{new_version}")
    if tf.io.gfile.exists(temp_dir):
        tf.io.gfile.rmtree(temp_dir)
    _copy_version(old_dir, temp_dir)
    held = serving_deltas.delta_numbers(old_dir)
    serving_deltas.write_delta(serving_deltas.delta_prefix(temp_dir, (held[-1] if held else 0) + 1), tensors)
    serving_versions.write_record(temp_dir, serving_versions.updated_record(record, version, deltas))
    tf.io.gfile.rename(temp_dir, new_dir)
    logger.info("serving update: version %d = version %d + %d delta(s) up to %s, written to %s in %.1f s",
                new_version, version, len(deltas), chain_end, new_dir, time.monotonic() - started)
    return new_dir.encode()


def _delta_tensors(served: serving_deltas.Served, deltas: List[str], old_dir: str) -> Dict[str, np.ndarray]:
    """The tensors of the version's next delta: every served table's changed rows, every other served variable."""
    readers = {delta: tf.compat.v1.train.NewCheckpointReader(delta) for delta in deltas}
    tensors: Dict[str, np.ndarray] = {}
    for name, (rows, dim, dtype) in served.fixed.items():
        keys, values, _ = _changed_rows(readers, name, dim, dtype, old_dir)
        if keys.size and (keys.min() < 0 or keys.max() >= rows):
            raise ServingUpdateError(
                f"serving update: the deltas {[os.path.basename(d) for d in deltas]} hold rows up to {keys.max()} "
                f"of table {name!r}, which has {rows} rows in SavedModel version {old_dir}: the version was not "
                "exported from this model's checkpoints")
        tensors[f"{name}/keys"], tensors[name] = keys, values
    for name, (dim, dtype) in served.hash.items():
        keys, values, evicted = _changed_rows(readers, name, dim, dtype, old_dir)
        tensors[f"{name}/keys"], tensors[name], tensors[serving_deltas.tombstones_key(name)] = keys, values, evicted
    last = readers[deltas[-1]]
    shapes, dtypes = last.get_variable_to_shape_map(), last.get_variable_to_dtype_map()
    for name, (shape, dtype) in served.dense.items():
        if name not in shapes:
            raise ServingUpdateError(
                f"serving update: SavedModel version {old_dir} serves the variable {name!r}, which the incremental "
                f"checkpoint {deltas[-1]} does not hold: the version was not exported from this model's checkpoints")
        if list(shapes[name]) != list(shape) or dtypes[name].name != dtype:
            raise ServingUpdateError(
                f"serving update: variable {name!r} is {_describe(dtype, shape)} in SavedModel version {old_dir} "
                f"but {_describe(dtypes[name].name, shapes[name])} in {deltas[-1]}: the version was not exported from "
                "this model's checkpoints")
        tensors[name] = last.get_tensor(name)
    return tensors


def _changed_rows(readers: Dict[str, object], name: str, dim: int, dtype: str, old_dir: str):
    """``(keys, rows, evicted keys)`` of table ``name`` over the deltas ``readers`` reads (oldest first).

    Each key counts once, as its last event says: a row (``keys``, ``rows``)
    or an eviction (a hash table's tombstones, which a delta applies before
    its rows). Empty (``[0]``, ``[0, dim]``, ``[0]``) when no delta holds any.
    """
    numpy_dtype = tf.as_dtype(dtype).as_numpy_dtype
    keys, values, is_row = [np.zeros([0], np.int64)], [np.zeros([0, dim], numpy_dtype)], [np.zeros([0], bool)]
    tombstones = hash_tables.keys_key(incremental.tombstones_key(name))
    for delta, reader in readers.items():
        if reader.has_tensor(tombstones):
            gone = reader.get_tensor(tombstones).astype(np.int64)
            keys.append(gone)
            values.append(np.zeros([len(gone), dim], numpy_dtype))
            is_row.append(np.zeros([len(gone)], bool))
        if not reader.has_tensor(f"{name}/keys"):  # no row of it changed in this delta
            continue
        have, have_dtype = reader.get_variable_to_shape_map()[name], reader.get_variable_to_dtype_map()[name]
        if list(have[1:]) != [dim] or have_dtype.name != dtype:
            raise ServingUpdateError(
                f"serving update: table {name!r} has rows of {_describe(dtype, [dim])} in SavedModel version "
                f"{old_dir} but {_describe(have_dtype.name, have[1:])} in {delta}: the version was not exported "
                "from this model's checkpoints")
        keys.append(reader.get_tensor(f"{name}/keys").astype(np.int64))
        values.append(reader.get_tensor(name))
        is_row.append(np.ones([len(keys[-1])], bool))
    keys, values, is_row = np.concatenate(keys), np.concatenate(values), np.concatenate(is_row)
    # The last event of each key wins: the first one in the reversed order.
    _, first = np.unique(keys[::-1], return_index=True)
    last = len(keys) - 1 - first
    rows = last[is_row[last]]
    return keys[rows], values[rows], keys[last[~is_row[last]]]


def _copy_version(old_dir: str, new_dir: str) -> None:
    """Version ``old_dir`` in ``new_dir``: its variables bundle and deltas linked, every other file but its record
    copied."""
    skip = os.path.normpath(os.path.join(old_dir, serving_versions.RECORD))
    variables = os.path.normpath(os.path.join(old_dir, serving_deltas.VARIABLES))
    for folder, _, files in tf.io.gfile.walk(old_dir):
        target = os.path.join(new_dir, os.path.relpath(folder, old_dir))
        tf.io.gfile.makedirs(target)
        for name in files:
            source = os.path.normpath(os.path.join(folder, name))
            if source == skip:
                continue
            if os.path.normpath(folder) == variables:
                serving_deltas.link_or_copy(source, os.path.join(target, name))
            else:
                tf.io.gfile.copy(source, os.path.join(target, name), overwrite=True)


def _describe(dtype: str, shape) -> str:
    return f"{dtype} [{', '.join(str(d) for d in shape)}]"


def _path(path) -> str:
    return compat.as_text(os.fspath(path))
