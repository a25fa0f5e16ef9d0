"""The manifest of an incremental checkpoint (a delta) and the chain it closes: base + deltas, checked.

A delta ``<save_path>-<step>.delta`` is a TensorFlow V2 bundle
(``.index`` / ``.data-*``) plus ``<prefix>.manifest.json``, written last
(temporary file, then rename) by rank 0 once the bundle is complete: a
delta without a manifest was never committed. The manifest names, relative
to its own folder:

- ``step``, ``world_size`` (the workers that wrote it), ``format``;
- ``base``: the full checkpoint the chain starts from, with its step and a
  fingerprint (the size and SHA-256 of its ``.index`` and of each data file),
  so a base rewritten or damaged after the chain was started is refused;
- ``previous``: the delta before this one (``null`` for the first), and
  ``previous_sha256``: the SHA-256 of that delta's manifest, which binds the
  link to the predecessor's content (its manifest lists its files' SHA-256):
  a later save of that step from another training history breaks the link;
- ``files``: every file of the bundle with its size and SHA-256;
- ``rows``: per table, the number of rows stored;
- ``plan``: the sharding plan it was saved under (:meth:`ShardingPlan.to_json`'s
  object), as a full checkpoint records its own in ``<prefix>.plan.json``
  (:func:`write_plan`; the bundle, which ``tf.train.load_variable`` reads, is unchanged).

:func:`verify_chain` walks ``previous`` links back to the base and checks
every file; :func:`latest_incremental_checkpoint` finds the newest delta of
a model_dir whose whole chain checks, or else the latest full checkpoint.
Pure file handling: no TensorFlow graph.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from typing import Collection, Dict, List, Optional, Tuple

import tensorflow as tf

from collective.sharding.plan import ShardingPlan

FORMAT = "collective-delta/2"
# Manifests of this format name their predecessor by file name only: a chain of them cannot be trusted.
UNBOUND_FORMATS = ("collective-delta/1",)
DELTA_SUFFIX = ".delta"
MANIFEST_SUFFIX = ".manifest.json"
PLAN_SUFFIX = ".plan.json"


class ChainError(ValueError):
    """An incremental checkpoint chain cannot be restored: a delta or its base is missing or torn."""


@dataclasses.dataclass(frozen=True)
class Chain:
    """A restorable chain: the full checkpoint ``base`` and ``deltas`` in order (prefixes), ending at ``step``."""

    base: str
    deltas: List[str]
    step: Optional[int]

    @property
    def last(self) -> str:
        """The prefix the chain ends at (the last delta, or the base)."""
        return self.deltas[-1] if self.deltas else self.base


def is_delta(prefix: str) -> bool:
    """Whether ``prefix`` names an incremental checkpoint (``...-<step>.delta``)."""
    return str(prefix).endswith(DELTA_SUFFIX)


def delta_prefix(checkpoint_file: str) -> str:
    """The delta prefix of a checkpoint file name ``<save_path>-<step>``."""
    return checkpoint_file + DELTA_SUFFIX


def manifest_path(prefix: str) -> str:
    return prefix + MANIFEST_SUFFIX


def bundle_files(prefix: str) -> List[str]:
    """The files of the V2 bundle ``prefix``: its index and data files."""
    return sorted(tf.io.gfile.glob(prefix + ".index") + tf.io.gfile.glob(glob.escape(prefix) + ".data-*"))


def remove_delta(prefix: str) -> None:
    """Removes delta ``prefix``: its manifest first (so no chain ends there any more), then its files."""
    path = manifest_path(prefix)
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)
    for f in bundle_files(prefix):
        tf.io.gfile.remove(f)


def file_entry(path: str) -> Dict:
    """``{name, bytes, sha256}`` of ``path`` (``name`` relative to its folder)."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return {"name": os.path.basename(path), "bytes": tf.io.gfile.stat(path).length, "sha256": digest.hexdigest()}


def _base_files(base: str) -> Tuple[str, List[str]]:
    files = bundle_files(base)
    index = [f for f in files if f.endswith(".index")]
    if not index:
        raise ChainError(f"the base checkpoint {base} has no {os.path.basename(base)}.index")
    return index[0], [f for f in files if not f.endswith(".index")]


def base_fingerprint(base: str) -> Dict:
    """What identifies a full checkpoint's files: its index's and its data files' sizes and SHA-256."""
    index, data = _base_files(base)
    return {"index": file_entry(index), "data": {os.path.basename(f): _size_and_sha(f) for f in data}}


def _size_and_sha(path: str) -> Dict:
    entry = file_entry(path)
    return {"bytes": entry["bytes"], "sha256": entry["sha256"]}


def manifest_sha256(prefix: str) -> str:
    """The SHA-256 of delta ``prefix``'s manifest: what its successor's manifest records (``previous_sha256``)."""
    return file_entry(manifest_path(prefix))["sha256"]


def write_manifest(prefix: str, step: int, world_size: int, base: str, base_step: Optional[int],
                   fingerprint: Dict, previous: Optional[str], rows: Dict[str, int],
                   plan: Optional[ShardingPlan] = None) -> str:
    """Writes ``prefix``'s manifest atomically (the delta's commit); returns its path.

    ``previous`` (the delta before, if any) must be committed: its manifest's SHA-256 is recorded.
    """
    folder = os.path.dirname(prefix)
    manifest = {
        "format": FORMAT, "step": int(step), "world_size": int(world_size),
        "base": {"prefix": os.path.relpath(base, folder), "step": base_step, "fingerprint": fingerprint},
        "previous": os.path.relpath(previous, folder) if previous else None,
        "previous_sha256": manifest_sha256(previous) if previous else None,
        "files": [file_entry(f) for f in bundle_files(prefix)],
        "rows": {name: int(n) for name, n in rows.items()},
        "plan": json.loads(plan.to_json()) if plan is not None else None,
    }
    return _write_atomically(manifest_path(prefix), json.dumps(manifest, indent=1, sort_keys=True))


def _write_atomically(path: str, text: str) -> str:
    temp = path + ".tmp"
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)
    return path


def write_plan(prefix: str, plan: ShardingPlan) -> str:
    """Records beside full checkpoint ``prefix`` the sharding plan it was saved under; returns the file's path."""
    return _write_atomically(prefix + PLAN_SUFFIX, plan.to_json())


def read_plan(prefix: str) -> Optional[ShardingPlan]:
    """The sharding plan checkpoint ``prefix`` (full or delta) was saved under; None when it recorded none."""
    if is_delta(prefix):
        recorded = read_manifest(prefix).get("plan")
        return ShardingPlan.from_json(json.dumps(recorded)) if recorded else None
    if not tf.io.gfile.exists(prefix + PLAN_SUFFIX):
        return None
    with tf.io.gfile.GFile(prefix + PLAN_SUFFIX) as f:
        return ShardingPlan.from_json(f.read())


def remove_orphan_plans(folder: str) -> None:
    """Removes the plan records of full checkpoints no longer there (deleted as older than ``max_to_keep``)."""
    for path in tf.io.gfile.glob(os.path.join(glob.escape(folder), "*" + PLAN_SUFFIX)):
        if not tf.io.gfile.exists(path[:-len(PLAN_SUFFIX)] + ".index"):
            tf.io.gfile.remove(path)


def read_manifest(prefix: str) -> Dict:
    """The manifest of delta ``prefix``; :class:`ChainError` when it is missing or unreadable."""
    path = manifest_path(prefix)
    if not tf.io.gfile.exists(path):
        raise ChainError(f"incremental checkpoint {prefix} has no manifest {os.path.basename(path)}: "
                         "its save never completed")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            manifest = json.loads(f.read())
    except (ValueError, OSError) as err:
        raise ChainError(f"incremental checkpoint {prefix}: its manifest {path} is unreadable ({err})") from err
    if manifest.get("format") in UNBOUND_FORMATS:
        raise ChainError(f"incremental checkpoint {prefix}: manifest format {manifest.get('format')!r} names its "
                         "predecessor by file name only, so its chain cannot be checked (a later save may have "
                         f"replaced a link); restore the full checkpoint {manifest.get('base', {}).get('prefix')!r} "
                         "and save a new chain")
    if manifest.get("format") != FORMAT:
        raise ChainError(f"incremental checkpoint {prefix}: manifest format {manifest.get('format')!r}, "
                         f"expected {FORMAT!r}")
    return manifest


def _problem_with_files(prefix: str, manifest: Dict, checksums: bool = True) -> Optional[str]:
    """What is wrong with delta ``prefix``'s files against its manifest (sizes; with ``checksums`` also SHA-256),
    or None."""
    folder = os.path.dirname(prefix)
    listed = {entry["name"] for entry in manifest["files"]}
    for entry in manifest["files"]:
        path = os.path.join(folder, entry["name"])
        if not tf.io.gfile.exists(path):
            return f"its file {entry['name']} is missing"
        size = tf.io.gfile.stat(path).length
        if size != entry["bytes"]:
            return f"its file {entry['name']} has {size} bytes, its manifest says {entry['bytes']}"
        if checksums and file_entry(path)["sha256"] != entry["sha256"]:
            return f"its file {entry['name']} does not match its manifest's SHA-256 checksum"
    extra = [os.path.basename(f) for f in bundle_files(prefix) if os.path.basename(f) not in listed]
    if extra:
        return f"its files {extra} are not in its manifest"
    return None


def _problem_with_base(base: str, fingerprint: Dict, checksums: bool = True) -> Optional[str]:
    """What is wrong with the base's files against a chain's ``fingerprint`` (with ``checksums`` also its data
    files' SHA-256: the whole base is read), or None."""
    try:
        index, data = _base_files(base)
    except ChainError as err:
        return str(err)
    sizes = {os.path.basename(f): tf.io.gfile.stat(f).length for f in data}
    recorded = fingerprint.get("data", {})
    if file_entry(index) != fingerprint.get("index") or sizes != {
            name: entry.get("bytes") if isinstance(entry, dict) else None for name, entry in recorded.items()}:
        return f"its base checkpoint {base} was rewritten after the chain started (its files differ)"
    if checksums:
        for path in data:
            if _size_and_sha(path) != recorded[os.path.basename(path)]:
                return (f"its base checkpoint {base} is damaged: its file {os.path.basename(path)} does not match "
                        "the SHA-256 checksum its chain recorded")
    return None


class _Broken(Exception):
    """A link of a chain is broken: ``message``; ``last_good``: the last checked prefix before it, if known."""

    def __init__(self, message: str, last_good: Optional[str]):
        super().__init__(message)
        self.message, self.last_good = message, last_good


def verify_chain(prefix: str, trusted: Collection[str] = ()) -> Chain:
    """The chain ending at ``prefix`` (a delta or a full checkpoint), every file checked.

    ``trusted``: names of deltas (``model.ckpt-5.delta``) or of the base
    whose files the caller will not read: only their sizes are checked, not
    their SHA-256 (a serving update skips the base and the deltas a version
    holds already). Otherwise the base's data files are read and checked
    against the SHA-256 the chain recorded, before anything is restored.

    Raises:
      ChainError: a delta of the chain (or its base) is missing or torn; the
        message names it and the last complete step, and how to restore that.
    """
    try:
        return _verify_chain(str(prefix), frozenset(trusted))
    except _Broken as broken:
        folder = os.path.dirname(str(prefix))
        last = broken.last_good or latest_incremental_checkpoint(folder)
        if last is None:
            offer = f"No complete checkpoint is left in {folder}."
        else:
            offer = (f"The last complete step is {step_of(last)}: restore it with saver.restore(sess, {last!r}) "
                     f"(collective.checkpoint.latest_incremental_checkpoint({folder!r}) names the newest one).")
        raise ChainError(f"{broken.message}. {offer}") from None


def _verify_chain(prefix: str, trusted: Collection[str] = frozenset(), base_checksums: bool = True) -> Chain:
    if not is_delta(prefix):
        return Chain(prefix, [], None)
    links: List[tuple] = []
    current: Optional[str] = prefix
    while current is not None:
        try:
            manifest = read_manifest(current)
        except ChainError as err:
            raise _Broken(str(err), None) from None
        if links and manifest_sha256(current) != links[-1][1].get("previous_sha256"):
            raise _Broken(f"incremental checkpoint {links[-1][0]}: its predecessor {current} is not the delta it was "
                          "saved after (that manifest's SHA-256 differs: a later save of that step, from another "
                          "training history, replaced it), so this chain mixes two histories", None)
        links.append((current, manifest))
        previous = manifest.get("previous")
        current = os.path.normpath(os.path.join(os.path.dirname(current), previous)) if previous else None
        if current is not None and any(os.path.normpath(link) == current for link, _ in links):
            raise _Broken(f"incremental checkpoint {prefix}: its chain links back to {current} twice", None)
    links.reverse()  # base first
    first = links[0][1]
    base = os.path.normpath(os.path.join(os.path.dirname(links[0][0]), first["base"]["prefix"]))
    problem = _problem_with_base(base, first["base"]["fingerprint"],
                                 base_checksums and os.path.basename(base) not in trusted)
    if problem:
        raise _Broken(f"incremental checkpoint {links[0][0]}: {problem}; no step of its chain can be restored",
                      None)
    good: List[str] = []
    for delta, manifest in links:
        problem = _problem_with_files(delta, manifest, os.path.basename(delta) not in trusted)
        if problem:
            raise _Broken(f"incremental checkpoint {delta} is torn: {problem}", good[-1] if good else base)
        good.append(delta)
    return Chain(base, good, links[-1][1]["step"])


def step_of(prefix: str) -> Optional[int]:
    """The global step in a checkpoint or delta prefix (``...-<step>`` or ``...-<step>.delta``), else None."""
    match = re.search(r"-(\d+)(?:\.delta)?$", prefix)
    return int(match.group(1)) if match else None


def later_deltas(checkpoint_file: str) -> List[str]:
    """The deltas ``<save_path>-<n>.delta`` beside ``checkpoint_file`` (``<save_path>-<step>``) with ``n > step``,
    committed or not, newest first."""
    step = step_of(checkpoint_file)
    stem = checkpoint_file[:checkpoint_file.rfind("-")] if step is not None else None
    if stem is None:
        return []
    found = set()
    pattern = glob.escape(stem) + "-*" + DELTA_SUFFIX
    for path in tf.io.gfile.glob(pattern + MANIFEST_SUFFIX) + tf.io.gfile.glob(pattern + ".index"):
        prefix = path[:-len(MANIFEST_SUFFIX)] if path.endswith(MANIFEST_SUFFIX) else path[:-len(".index")]
        later = step_of(prefix)
        if later is not None and later > step and prefix[:prefix.rfind("-")] == stem:
            found.add((later, prefix))
    return [prefix for _, prefix in sorted(found, reverse=True)]


def latest_incremental_checkpoint(model_dir: str, latest_filename: Optional[str] = None) -> Optional[str]:
    """The prefix to restore to reach the newest complete step of ``model_dir``.

    That is the newest delta whose whole chain checks (:func:`verify_chain`)
    and starts at the latest full checkpoint (the ``checkpoint`` state
    file's), else that full checkpoint, else None. Deltas never committed or
    torn are skipped (logged by the caller's restore, not here). The base's
    data files are checked by size here; their SHA-256 by the restore.
    """
    full = tf.train.latest_checkpoint(str(model_dir), latest_filename)
    if full is None:
        return None
    moved = os.path.join(str(model_dir), os.path.basename(full))  # a state file's absolute paths, dir copied
    if tf.io.gfile.exists(moved + ".index"):
        full = moved
    candidates = []
    for path in tf.io.gfile.glob(os.path.join(glob.escape(str(model_dir)), "*" + DELTA_SUFFIX + MANIFEST_SUFFIX)):
        prefix = path[:-len(MANIFEST_SUFFIX)]
        step = step_of(prefix)
        if step is not None:
            candidates.append((step, prefix))
    for _, prefix in sorted(candidates, reverse=True):
        try:
            chain = _verify_chain(prefix, base_checksums=False)  # the restore reads the base's data: it checks
        except _Broken:
            continue
        if os.path.normpath(chain.base) == os.path.normpath(full):
            return prefix
    return full
