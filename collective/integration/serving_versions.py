"""Which checkpoint each SavedModel version holds, and which deltas of a chain bring a version up to date.

Every version collective writes (a full export or a serving update) carries
``assets.extra/collective_checkpoint.json`` (TF Serving copies nothing from
``assets.extra`` into the graph and ignores unknown files there):

- ``format`` (``collective-serving/1``) and ``step``, the global step the
  version's variables hold;
- ``base``: the full checkpoint the version comes from (its prefix as it was
  then, its step and its fingerprint, :func:`collective.checkpoint.manifest.base_fingerprint`);
- ``deltas``: the incremental checkpoints applied on top of it, oldest first,
  each with its step and the SHA-256 of its ``.index`` (from its manifest);
- ``served``: what the version serves and each of its deltas holds: fixed
  tables (rows, dim, dtype), hash tables (dim, dtype), other variables
  (shape, dtype) (:class:`~collective.integration.serving_deltas.Served`);
- ``previous_version``: the version a serving update started from (``null``
  for a full export).

A chain can update a version when it has the same base (same fingerprint:
files, not paths, so a copied model_dir still matches) and its first deltas
are the version's deltas: those are skipped and the rest are applied.
Versions are the integer-named folders of an export base (TF Serving's
rule); folders of any other name (``temp-*`` of an export in progress) are
not versions. Pure file handling: no TensorFlow graph.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Dict, List, Optional

import tensorflow as tf

from collective.checkpoint import manifest
from collective.tf_internals import compat

logger = logging.getLogger("collective.integration.serving_versions")

FORMAT = "collective-serving/1"
RECORD = os.path.join("assets.extra", "collective_checkpoint.json")


class ServingUpdateError(ValueError):
    """A SavedModel version cannot be updated from the given incremental checkpoint chain."""


def versions(export_dir_base: str) -> List[int]:
    """The version numbers under ``export_dir_base`` (its integer-named folders), ascending."""
    base = os.fspath(export_dir_base)
    if not tf.io.gfile.isdir(base):
        return []
    found = []
    for name in tf.io.gfile.listdir(base):
        name = name.rstrip("/")
        if name.isdigit() and tf.io.gfile.isdir(os.path.join(base, name)):
            found.append(int(name))
    return sorted(found)


def next_version(export_dir_base: str) -> int:
    """A version number above every existing one: the time in seconds, as TensorFlow's exports name theirs,
    or the newest version + 1 when that is not larger."""
    existing = versions(export_dir_base)
    return max(int(time.time()), existing[-1] + 1 if existing else 0)


def step_of_checkpoint(checkpoint_path: str) -> Optional[int]:
    """The global step of a full checkpoint: from its name (``...-<step>``), else its ``global_step``, else None."""
    step = manifest.step_of(checkpoint_path)
    if step is not None:
        return step
    reader = tf.compat.v1.train.NewCheckpointReader(checkpoint_path)
    return int(reader.get_tensor("global_step")) if reader.has_tensor("global_step") else None


def full_export_record(checkpoint_path: str, served) -> Dict:
    """The record of a version exported from the full checkpoint ``checkpoint_path``, serving ``served``
    (a :class:`~collective.integration.serving_deltas.Served`)."""
    step = step_of_checkpoint(checkpoint_path)
    return {"format": FORMAT, "step": step, "previous_version": None, "deltas": [],
            "base": {"prefix": os.path.abspath(checkpoint_path), "step": step,
                     "fingerprint": manifest.base_fingerprint(checkpoint_path)},
            "served": served.to_json()}


def updated_record(record: Dict, previous_version: int, applied: List[str]) -> Dict:
    """The record of a version made from ``record``'s version by applying the deltas ``applied``."""
    deltas = list(record["deltas"]) + [_delta_entry(prefix) for prefix in applied]
    return {**record, "step": deltas[-1]["step"], "previous_version": int(previous_version), "deltas": deltas}


def write_record(version_dir, record: Dict) -> str:
    """Writes ``record`` into the version folder ``version_dir`` (not yet renamed into place); returns its path."""
    path = os.path.join(_text(version_dir), RECORD)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(record, indent=1, sort_keys=True))
    return path


def read_record(version_dir) -> Dict:
    """The record of the version in ``version_dir``; :class:`ServingUpdateError` when it has none or is unreadable."""
    version_dir = _text(version_dir)
    path = os.path.join(version_dir, RECORD)
    if not tf.io.gfile.exists(path):
        raise ServingUpdateError(
            f"SavedModel version {version_dir} has no {RECORD}: it was not written by collective's export "
            "(export_saved_model / export_estimator of this version of collective), so which checkpoint it holds "
            "is unknown. Export a full version from a full checkpoint first, then update that one.")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            record = json.loads(f.read())
    except (ValueError, OSError) as err:
        raise ServingUpdateError(f"SavedModel version {version_dir}: {path} is unreadable ({err})") from err
    if record.get("format") != FORMAT:
        raise ServingUpdateError(f"SavedModel version {version_dir}: {path} has format {record.get('format')!r}, "
                                 f"expected {FORMAT!r}")
    return record


def deltas_to_apply(record: Dict, version_dir: str, chain: manifest.Chain) -> List[str]:
    """The deltas of ``chain`` that come after the version ``record`` describes, in order.

    Raises:
      ServingUpdateError: the chain does not continue the version: it ends at
        a full checkpoint, starts from another base (a later one leaves a gap:
        the rows trained in between are in none of its deltas), holds other
        deltas than the version's up to the version's step, or has none after it.
    """
    end = chain.last
    version_step = record.get("step")
    if not chain.deltas:
        raise ServingUpdateError(
            f"{end} is a full checkpoint, not an incremental one: export it with export_saved_model (a full "
            f"export) instead of updating version {version_dir}")
    first = manifest.read_manifest(chain.deltas[0])
    if first["base"]["fingerprint"] != record["base"]["fingerprint"]:
        chain_base_step = first["base"].get("step")
        if version_step is not None and chain_base_step is not None and chain_base_step > version_step:
            why = (f"the chain of {end} starts at the full checkpoint {chain.base} (step {chain_base_step}), after "
                   f"version {version_dir}'s step {version_step}: the rows trained between steps {version_step} and "
                   f"{chain_base_step} are in none of its deltas (a gap)")
        else:
            why = (f"version {version_dir} holds {record['base']['prefix']} (step {record['base'].get('step')}) "
                   f"plus {len(record['deltas'])} delta(s), but the chain of {end} starts from the full checkpoint "
                   f"{chain.base} (step {chain_base_step}), whose files differ")
        raise ServingUpdateError(f"cannot update SavedModel version {version_dir} from {end}: {why}. Export a full "
                                 f"version from {chain.base} (export_saved_model), then update it from its deltas.")
    held = record["deltas"]
    for position, entry in enumerate(held):
        delta = chain.deltas[position] if position < len(chain.deltas) else None
        if delta is None:
            raise ServingUpdateError(
                f"incremental checkpoint {end} (step {chain.step}) is not newer than SavedModel version "
                f"{version_dir} (step {version_step}): nothing to apply. Pass a later delta, e.g. "
                "collective.checkpoint.latest_incremental_checkpoint(model_dir).")
        if _delta_entry(delta) != entry:
            raise ServingUpdateError(
                f"cannot update SavedModel version {version_dir} from {end}: the version holds the delta "
                f"{entry['prefix']} (step {entry['step']}), but that link of the chain is {delta} (step "
                f"{manifest.step_of(delta)}) with other files (a chain saved again after a restart?). Export a full "
                f"version from {chain.base}, then update it from its deltas.")
    new = chain.deltas[len(held):]
    if not new:
        raise ServingUpdateError(
            f"incremental checkpoint {end} (step {chain.step}) is not newer than SavedModel version {version_dir} "
            f"(step {version_step}): nothing to apply. Pass a later delta, e.g. "
            "collective.checkpoint.latest_incremental_checkpoint(model_dir).")
    skipped = len(chain.deltas) - len(new)
    if skipped:
        logger.info("serving update: %d delta(s) of the chain are in version %s already", skipped, version_dir)
    return new


def _delta_entry(prefix: str) -> Dict:
    """What identifies a delta in a record: its name, step and its index's SHA-256 (from its manifest)."""
    entries = manifest.read_manifest(prefix)["files"]
    index = [e["sha256"] for e in entries if e["name"].endswith(".index")]
    return {"prefix": os.path.basename(prefix), "step": manifest.step_of(prefix), "index_sha256": index[0]}


def _text(path) -> str:
    return compat.as_text(os.fspath(path))
