"""A ``tf.compat.v1.train.Saver`` whose checkpoints hold whole logical tables.

Every worker calls :meth:`Saver.save` at the same steps (it runs
collectives). A save is all-or-nothing:

1. each worker re-lays its shards into contiguous row blocks (one alltoall
   per tensor) and writes them as slices of the full ``[vocab, dim]``
   tensors into its own temporary part; rank 0 also writes the replicated
   variables once, and each sharded tensor's stored row bounds under
   ``_collective/row_splits/<name>``;
2. a barrier; if any worker failed, every worker raises;
3. rank 0 merges the parts into the checkpoint (``MergeV2Checkpoints``),
   removes what is left of the temporary folder (parts of a killed save of
   this step by another number of workers) and only then updates the
   ``checkpoint`` state file, so a crash before this point leaves the
   previous checkpoint the latest and usable;
4. a second barrier, so ``save`` returns on every worker once the
   checkpoint is complete.

Saving over an existing checkpoint (the same step again) is not atomic: the
merge renames the data files over the old ones, then truncates and rewrites
the old index. ``collective.integration.session.CheckpointSaverHook`` therefore skips
the save of the step a session was just restored from (:meth:`Saver.restored_into`).

:meth:`Saver.restore` needs no collective: each worker reads the stored
blocks one at a time and keeps its rows, so a checkpoint written by N
workers restores under any M. A plain single-process ``Saver`` over
full-size variables reads the same files.
"""

from __future__ import annotations

import glob
import logging
import os
import time
import weakref
from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saver_pb2

from collective import comm
from collective.runtime import heartbeat
from collective.checkpoint import hash_tables, incremental, layout, manifest, touched
from collective.checkpoint.model_dir import (CheckpointMismatchError, check_shapes, checkpoint_key, model_shapes,
                                             sharded_names, split_var_list)
from collective.embedding.table import shard_of
from collective.sharding import runtime as sharding_runtime
from collective.sharding.plan import ShardingPlan
from collective.tf_internals import checkpoint_management, compat, extending, io_ops, saver_lib, training_util

logger = logging.getLogger("collective.checkpoint")
# How many times the touched-row marks of each graph have been cleared, by any Saver: a chain whose last link
# was not the last clear would miss the rows marked before that clear.
_MARKS_CLEARED: "weakref.WeakKeyDictionary[tf.Graph, int]" = weakref.WeakKeyDictionary()

ROW_SPLITS_SCOPE = "_collective/row_splits/"


class CheckpointError(RuntimeError):
    """A worker failed while a checkpoint was being written; the previous one stays the latest."""


def row_splits_key(key: str) -> str:
    """The checkpoint key holding the stored row bounds of the sharded tensor ``key``."""
    return ROW_SPLITS_SCOPE + key


def stored_row_splits(reader, shapes, key: str) -> np.ndarray:
    """Row bounds of the blocks ``key`` is stored in (one block when no bounds were written)."""
    splits_key = row_splits_key(key)
    if reader.has_tensor(splits_key):
        return np.asarray(reader.get_tensor(splits_key), np.int64)
    return np.array([0, shapes[key][0]] if key in shapes else [0], np.int64)


class Saver(saver_lib.Saver):
    """Saves and restores sharded tables as whole logical tables; see the module docstring.

    Takes ``tf.compat.v1.train.Saver``'s arguments; ``sharded``, ``reshape``,
    ``builder``, ``saver_def``, ``restore_sequentially`` and ``filename`` are
    accepted and ignored (the layout is always this one). Build it the same
    way on every worker.
    """

    def __init__(self, var_list=None, max_to_keep=5, keep_checkpoint_every_n_hours=10000.0, name=None,
                 defer_build=False, allow_empty=False, pad_step_number=False, save_relative_paths=False,
                 **ignored):
        if ignored.get("saver_def") is not None:
            raise ValueError("collective.checkpoint.Saver builds its own ops; it cannot be made from a saver_def")
        self._sharded_vars: List = []
        self._last_restore: Tuple[Optional[weakref.ref], Optional[str]] = (None, None)
        self._chain: Optional[manifest.Chain] = None  # what the next delta chains to
        self._marks_cleared = 0  # the graph's count of mark clears after this saver's last link (_MARKS_CLEARED)
        self._fingerprint: Optional[Tuple[str, dict]] = None
        # Set by IncrementalSaverHook: a restore of a model_dir's latest full checkpoint takes its newest chain.
        self.resume_chains = False
        super().__init__(var_list=var_list, max_to_keep=max_to_keep,
                         keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, name=name,
                         defer_build=defer_build, allow_empty=allow_empty, pad_step_number=pad_step_number,
                         save_relative_paths=save_relative_paths, sharded=True)

    # ------------------------------------------------------------------ build

    def _build(self, checkpoint_path, build_save, build_restore):  # pylint: disable=unused-argument
        if tf.executing_eagerly():
            raise RuntimeError("collective.checkpoint.Saver works in graph mode (tf.compat.v1 graphs) only")
        if self._is_built:
            return
        self._is_built = True
        sharded, saveables = split_var_list(self._var_list)
        self._names = sharded_names(self._var_list)
        if not sharded and not saveables:
            if self._allow_empty:
                self._is_empty = True
                return
            raise ValueError("No variables to save")
        self._is_empty = False
        self._families = hash_tables.families(sharded)
        self._sharded_vars = [v for v in sharded if shard_of(v).hash_index is None]
        self._saveables = saveables
        self._expected_shapes = model_shapes(sharded, saveables, self._names)
        for family in self._families:
            self._expected_shapes[hash_tables.keys_key(family.name)] = (None,)
        self._delta_tables = incremental.group_tables(sharded, self._names)
        self._whole_in_deltas = [(t, f) for t, f in enumerate(self._families) if f.whole_in_deltas]
        self._delta_ops_built = False
        with tf.name_scope(self._name or "collective_save") as scope, comm.uncounted():
            self._scope = scope
            self._evict_at_save = hash_tables.build_checkpoint_eviction(self._families, incremental.touched_masks)
            self._build_save_ops(self._sharded_vars, saveables)
            self._build_restore_ops(self._sharded_vars, saveables)
            # After every committed save or restore: nothing is marked, and policy tables remember the keys they
            # hold (so the first delta, whenever its ops are built, holds exactly what changed since then).
            self._clear_touched = tf.group(touched.clear([table.variables[0] for table in self._delta_tables]),
                                           *[t.dynamic.snapshot() for t in self._delta_tables if t.dynamic is not None])
        self.saver_def = saver_pb2.SaverDef(
            filename_tensor_name=self._restore_prefix.name, save_tensor_name=self._save_tensor.name,
            restore_op_name=self._restore_op.name, max_to_keep=self._max_to_keep, sharded=True,
            keep_checkpoint_every_n_hours=self._keep_checkpoint_every_n_hours,
            version=saver_pb2.SaverDef.V2)
        self._next_checkpoint_time = time.time() + self._keep_checkpoint_every_n_hours * 3600

    def _build_save_ops(self, sharded, saveables):
        self._part_prefix = tf.compat.v1.placeholder(tf.string, [], name="part_prefix")
        self._replicated_prefix = tf.compat.v1.placeholder(tf.string, [], name="replicated_prefix")
        names, specs, tensors, empty = [], [], [], []
        for var in sharded:
            info = shard_of(var)
            bounds = layout.block_bounds(info.vocab, info.world_size)
            lo, hi = bounds[info.rank], bounds[info.rank + 1]
            block = layout.contiguous_block(var.read_value(), info)
            if hi == lo:  # fewer rows than workers (column-wise): no block here, but the exchange must run
                empty.append(block)
                continue
            names.append(checkpoint_key(var, self._names))
            specs.append(f"{info.vocab} {info.dim} {lo},{hi - lo}:-")
            tensors.append(block)
        self._shard_save = io_ops.save_v2(self._part_prefix, names, specs, tensors) if names else tf.no_op()
        self._dense_writers = _dense_writers(sharded)
        # Fetched beside the save (Grappler drops a collective that only a control dependency waits for).
        self._empty_blocks = empty
        for t, family in enumerate(self._families):
            hash_tables.build_save(family, tf.strings.join([self._part_prefix, f"-hash{t}"]))
        rep_names, rep_specs, rep_tensors = _flat_specs(saveables)
        for var in sharded:
            info = shard_of(var)
            rep_names.append(row_splits_key(checkpoint_key(var, self._names)))
            rep_specs.append("")
            rep_tensors.append(tf.constant(sorted(set(layout.block_bounds(info.vocab, info.world_size))), tf.int64))
        for family in self._families:
            rep_names.append(row_splits_key(family.name))
            rep_specs.append("")
            rep_tensors.append(family.row_splits)
        self._replicated_save = io_ops.save_v2(self._replicated_prefix, rep_names, rep_specs, rep_tensors)
        with tf.control_dependencies([self._shard_save]):
            self._save_tensor = tf.identity(self._part_prefix, name="saved_part")
        self._flag = tf.compat.v1.placeholder(tf.int32, [], name="ok")
        self._barrier = comm.allreduce(self._flag, "sum")
        self._merge_parts = tf.compat.v1.placeholder(tf.string, [None], name="parts")
        self._merge_dest = tf.compat.v1.placeholder(tf.string, [], name="destination")
        self._merge = io_ops.merge_v2_checkpoints(self._merge_parts, self._merge_dest, delete_old_dirs=True)

    def _build_restore_ops(self, sharded, saveables):
        self._restore_prefix = tf.compat.v1.placeholder_with_default("model.ckpt", [], name="restore_prefix")
        self._row_splits = {}
        ops = []
        # One tensor at a time: a worker holds its shards plus one stored block at most.
        for var in sharded:
            info = shard_of(var)
            key = checkpoint_key(var, self._names)
            splits = tf.compat.v1.placeholder_with_default(
                tf.constant([0, info.vocab], tf.int64), [None], name="row_splits")
            self._row_splits[key] = splits
            with tf.control_dependencies(ops[-1:]):
                rows = layout.held_columns(layout.restore_rows(self._restore_prefix, key, splits,
                                                               [info.vocab, info.dim], var.dtype.base_dtype,
                                                               info.layout), info)
                ops.append(var.assign(rows, read_value=False))
        if saveables:
            ops.append(saver_lib.BulkSaverBuilder()._AddRestoreOps(  # pylint: disable=protected-access
                self._restore_prefix, saveables, restore_sequentially=False, reshape=False))
        self._restore_op = tf.group(*ops, name="restore_all")
        for family in self._families:
            hash_tables.build_restore(family, self._restore_prefix, comm.rank(), comm.world_size())

    def _ensure_delta_ops(self) -> None:
        """Builds the ops of incremental saves and delta restores the first time one is asked for.

        They cost about as much graph as the rest of the saver, and most
        programs never write or read a delta; a finalized graph is extended
        (the session runs the new ops like any other).
        """
        if self._delta_ops_built:
            return
        with extending(self._restore_prefix.graph), tf.name_scope(self._scope), comm.uncounted():
            self._build_delta_ops(self._saveables)
        self._delta_ops_built = True

    def _build_delta_ops(self, saveables):
        """The ops of incremental saves and of restoring a delta (:mod:`.incremental`)."""
        self._delta_part = tf.compat.v1.placeholder(tf.string, [], name="delta_part_prefix")
        self._delta_replicated = tf.compat.v1.placeholder(tf.string, [], name="delta_replicated_prefix")
        self._delta_prefix = tf.compat.v1.placeholder_with_default("model.ckpt.delta", [], name="delta_prefix")
        rep_names, rep_specs, rep_tensors = _flat_specs(saveables)
        for t, table in enumerate(self._delta_tables):
            incremental.build_save(table, tf.strings.join([self._delta_part, f"-delta{t}"]), self._names)
            rep_names.append(row_splits_key(table.name))
            rep_specs.append("")
            rep_tensors.append(table.row_splits)
            if table.tombstone_splits is not None:
                rep_names.append(row_splits_key(incremental.tombstones_key(table.name)))
                rep_specs.append("")
                rep_tensors.append(table.tombstone_splits)
            with tf.name_scope("restore_delta"):
                incremental.build_restore(table, self._delta_prefix, comm.rank(), comm.world_size(), self._names)
        # Counter tables of vocabulary policies: whole in every delta, by the full save's ops (fed the delta's part).
        for _, family in self._whole_in_deltas:
            rep_names.append(row_splits_key(family.name))
            rep_specs.append("")
            rep_tensors.append(family.row_splits)
        self._delta_replicated_save = io_ops.save_v2(self._delta_replicated, rep_names, rep_specs, rep_tensors)
        self._delta_dense_restore = (saver_lib.BulkSaverBuilder()._AddRestoreOps(  # pylint: disable=protected-access
            self._delta_prefix, saveables, restore_sequentially=False, reshape=False) if saveables else tf.no_op())

    # ------------------------------------------------------------------ save

    def save(self, sess, save_path, global_step=None, latest_filename=None, meta_graph_suffix="meta",
             write_meta_graph=True, write_state=True, strip_default_attrs=False, save_debug_info=False):
        """Writes a checkpoint of the whole model; every worker must call it at the same step.

        Returns the checkpoint prefix (the same on every worker), or None when
        there is nothing to save.
        """
        with heartbeat.phase("save"):  # the others wait in its barriers however long a worker writes: no stall
            return self._save_all(sess, save_path, global_step, latest_filename, meta_graph_suffix, write_meta_graph,
                                  write_state, strip_default_attrs, save_debug_info)

    def _save_all(self, sess, save_path, global_step, latest_filename, meta_graph_suffix, write_meta_graph,
                  write_state, strip_default_attrs, save_debug_info) -> Optional[str]:
        if not self._is_built:
            raise RuntimeError("`build()` should be called before save if defer_build==True")
        if self._is_empty:
            return None
        latest_filename = latest_filename or "checkpoint"
        if os.path.split(latest_filename)[0]:
            raise ValueError("'latest_filename' must not contain path components")
        save_path = compat.as_str(save_path)
        if global_step is not None and not isinstance(global_step, compat.integral_types):
            global_step = training_util.global_step(sess, global_step)
        checkpoint_file = self.checkpoint_file(save_path, global_step)
        parts_dir = checkpoint_file + "_temp"
        n, rank = comm.world_size(), comm.rank()
        shard_parts = [os.path.join(parts_dir, f"part-{s:05d}-of-{n:05d}") for s in range(n)]
        replicated_part = os.path.join(parts_dir, "replicated")
        dense_parts = [shard_parts[s] for s in self._dense_writers]

        error = _attempt(lambda: self._write_parts(sess, parts_dir, shard_parts[rank], replicated_part))
        self._agree(sess, error, f"writing its part of checkpoint {checkpoint_file}")
        if rank == 0:
            parts = dense_parts + self._hash_parts(shard_parts) + [replicated_part]
            error = _attempt(lambda: self._commit(sess, parts, parts_dir, checkpoint_file, save_path,
                                                  latest_filename, meta_graph_suffix, write_state))
        elif write_state:
            self._RecordLastCheckpoint(checkpoint_file)
            self._checkpoints_to_be_deleted.clear()  # rank 0 deletes old checkpoints
        self._agree(sess, error, f"merging checkpoint {checkpoint_file}")
        self._start_chain(sess, checkpoint_file)
        if rank == 0 and write_meta_graph:
            with sess.graph.as_default():
                self.export_meta_graph(
                    checkpoint_management.meta_graph_filename(checkpoint_file, meta_graph_suffix=meta_graph_suffix),
                    strip_default_attrs=strip_default_attrs, save_debug_info=save_debug_info)
        return checkpoint_file

    def save_incremental(self, sess, save_path, global_step=None) -> Optional[str]:
        """Writes a delta: the table rows changed since the last save, and every replicated variable.

        Every worker calls it at the same step. The delta chains to the last
        checkpoint this saver wrote or restored in this process (a full one
        from :meth:`save`, or a delta): that one must exist. Its prefix is
        ``<save_path>-<step>.delta``; restore it with :meth:`restore` (base and
        deltas in order, on any number of workers). Returns that prefix.

        When another ``Saver`` of the graph saved or restored a checkpoint
        since this saver's last link, the rows changed before that are no
        longer marked: this writes a full checkpoint (``<save_path>-<step>``,
        its prefix returned) that starts a new chain, and logs why.

        Raises:
          CheckpointError: no full checkpoint to chain to yet, or a worker failed (the previous delta stays
            the last complete one).
        """
        with heartbeat.phase("save"):
            return self._save_delta(sess, save_path, global_step)

    def _save_delta(self, sess, save_path, global_step) -> Optional[str]:
        if not self._is_built:
            raise RuntimeError("`build()` should be called before save_incremental if defer_build==True")
        if self._is_empty:
            return None
        if self._chain is None:
            raise CheckpointError(
                "save_incremental needs a full checkpoint to chain to: call saver.save(...) (or restore one) first")
        if _MARKS_CLEARED.get(sess.graph, 0) != self._marks_cleared:
            logger.warning("another Saver saved or restored a checkpoint after %s, the end of this saver's chain, "
                           "and so cleared the marks of the rows changed before it: writing a full checkpoint "
                           "instead of a delta (a delta would restore those rows stale)", self._chain_end())
            return self._save_all(sess, save_path, global_step, None, "meta", True, True, False, False)
        save_path = compat.as_str(save_path)
        if global_step is not None and not isinstance(global_step, compat.integral_types):
            global_step = training_util.global_step(sess, global_step)
        prefix = manifest.delta_prefix(self.checkpoint_file(save_path, global_step))
        if self._chain.deltas and os.path.normpath(self._chain.deltas[-1]) == os.path.normpath(prefix):
            raise CheckpointError(f"incremental checkpoint {prefix} is already the end of the chain (the global step "
                                  "has not moved since it was saved); save a later step")
        parts_dir = prefix + "_temp"
        n, rank = comm.world_size(), comm.rank()
        self._ensure_delta_ops()
        part = os.path.join(parts_dir, f"part-{rank:05d}-of-{n:05d}")
        replicated_part = os.path.join(parts_dir, "replicated")
        rows: List[int] = []
        error = _attempt(lambda: rows.extend(self._write_delta_parts(sess, parts_dir, part, replicated_part)))
        self._agree(sess, error, f"writing its part of incremental checkpoint {prefix}")
        if rank == 0:
            error = _attempt(lambda: self._commit_delta(sess, prefix, parts_dir, n, global_step, rows))
        self._agree(sess, error, f"committing incremental checkpoint {prefix}")
        self._clear_marks(sess)
        self._chain = manifest.Chain(self._chain.base, self._chain.deltas + [prefix], global_step)
        logger.info("incremental checkpoint %s: %s rows", prefix,
                    ", ".join(f"{t.name} {r}" for t, r in zip(self._delta_tables, rows)) or "no tables")
        return prefix

    def _write_delta_parts(self, sess, parts_dir: str, part: str, replicated_part: str) -> List[int]:
        """Writes this worker's part of a delta (and on rank 0 the replicated variables); returns rows per table."""
        _clear_own_parts(parts_dir, part, replicated_part)
        self._evict_before_writing(sess)
        fetches = {"saves": [t.save for t in self._delta_tables], "splits": [t.row_splits for t in self._delta_tables],
                   "tombstones": [t.tombstone_save for t in self._delta_tables if t.tombstone_save is not None]}
        feed = {self._delta_part: part, self._part_prefix: part}
        fetches["whole"] = [family.save for _, family in self._whole_in_deltas]
        if comm.rank() == 0:
            fetches["replicated"] = self._delta_replicated_save
            feed[self._delta_replicated] = replicated_part
        return [int(splits[-1]) for splits in sess.run(fetches, feed)["splits"]]

    def _commit_delta(self, sess, prefix, parts_dir, n, step, rows) -> None:
        """Rank 0: merges the delta's parts, then writes its manifest (the commit)."""
        parts = [os.path.join(parts_dir, f"part-{s:05d}-of-{n:05d}-delta{t}{suffix}") for s in range(n)
                 for t in range(len(self._delta_tables)) for suffix in ("", incremental.TOMBSTONE_PART)]
        parts += [os.path.join(parts_dir, f"part-{s:05d}-of-{n:05d}-hash{t}") for s in range(n)
                  for t, _ in self._whole_in_deltas]
        parts = [p for p in parts if tf.io.gfile.exists(p + ".index")] + [os.path.join(parts_dir, "replicated")]
        manifest.remove_delta(prefix)  # an uncommitted bundle of a killed save, or this step's delta saved before
        sess.run(self._merge, {self._merge_parts: parts, self._merge_dest: prefix})
        _remove_stale_parts(parts_dir)
        for later in manifest.later_deltas(prefix[:-len(manifest.DELTA_SUFFIX)]):
            logger.warning("retiring incremental checkpoint %s: a later step of another training history than %s's",
                           later, prefix)
            manifest.remove_delta(later)
        chain = self._chain
        manifest.write_manifest(prefix, step if step is not None else -1, n, chain.base, manifest.step_of(chain.base),
                                self._base_fingerprint(chain.base), chain.deltas[-1] if chain.deltas else None,
                                {t.name: r for t, r in zip(self._delta_tables, rows)}, _plan())

    def _base_fingerprint(self, base: str) -> dict:
        """The chain base's fingerprint, computed once per base (rank 0)."""
        if self._fingerprint is None or self._fingerprint[0] != base:
            self._fingerprint = (base, manifest.base_fingerprint(base))
        return self._fingerprint[1]

    def _start_chain(self, sess, checkpoint_file: str) -> None:
        """After a committed full save or a restore: later deltas chain to ``checkpoint_file``; nothing is marked."""
        self._clear_marks(sess)
        self._chain = manifest.Chain(checkpoint_file, [], None)

    def _clear_marks(self, sess) -> None:
        sess.run(self._clear_touched)
        self._marks_cleared = _MARKS_CLEARED[sess.graph] = _MARKS_CLEARED.get(sess.graph, 0) + 1

    def _chain_end(self) -> str:
        return self._chain.deltas[-1] if self._chain.deltas else self._chain.base

    def checkpoint_file(self, save_path: str, global_step: Optional[int] = None) -> str:
        """The prefix :meth:`save` writes for ``save_path`` at ``global_step``: ``<save_path>-<step>``."""
        if global_step is None:
            return save_path
        return f"{save_path}-{global_step:08d}" if self._pad_step_number else f"{save_path}-{global_step}"

    def restored_into(self, sess) -> Optional[str]:
        """The checkpoint prefix this saver last restored into ``sess`` (None if it restored none there)."""
        session, prefix = self._last_restore
        return prefix if session is not None and session() is sess else None

    def _write_parts(self, sess, parts_dir: str, shard_part: str, replicated_part: str) -> None:
        """Writes this worker's part (and on rank 0 the replicated variables)."""
        _clear_own_parts(parts_dir, shard_part, replicated_part)
        self._evict_before_writing(sess)
        fetches = [self._shard_save, self._empty_blocks] + [family.save for family in self._families]
        feed = {self._part_prefix: shard_part}
        if comm.rank() == 0:
            fetches.append(self._replicated_save)
            feed[self._replicated_prefix] = replicated_part
        sess.run(fetches, feed)

    def _evict_before_writing(self, sess) -> None:
        """The eviction run of tables whose policy evicts at checkpoints (a collective: every worker saves)."""
        if self._evict_at_save is not None:
            sess.run(self._evict_at_save)

    def _hash_parts(self, shard_parts: List[str]) -> List[str]:
        """The hash-table parts the workers wrote (a worker holding no key of a table writes none)."""
        candidates = [f"{part}-hash{t}" for part in shard_parts for t in range(len(self._families))]
        return [p for p in candidates if tf.io.gfile.exists(p + ".index")]

    def _commit(self, sess, parts, parts_dir, checkpoint_file, save_path, latest_filename, meta_graph_suffix,
                write_state) -> None:
        """Rank 0: merges the parts, clears ``parts_dir``, then names the new checkpoint in the state file."""
        sess.run(self._merge, {self._merge_parts: parts, self._merge_dest: checkpoint_file})
        _remove_stale_parts(parts_dir)
        plan = _plan()
        if plan is not None:
            manifest.write_plan(checkpoint_file, plan)
        if write_state:
            self._RecordLastCheckpoint(checkpoint_file)
            checkpoint_management.update_checkpoint_state_internal(
                save_dir=os.path.dirname(save_path), model_checkpoint_path=checkpoint_file,
                all_model_checkpoint_paths=self.last_checkpoints, latest_filename=latest_filename,
                save_relative_paths=self._save_relative_paths)
            self._MaybeDeleteOldCheckpoints(meta_graph_suffix=meta_graph_suffix)
            manifest.remove_orphan_plans(os.path.dirname(checkpoint_file))

    def _agree(self, sess, error: Optional[BaseException], what: str) -> None:
        """Barrier: raises on every worker if any worker failed."""
        ok = sess.run(self._barrier, {self._flag: int(error is None)})
        if error is not None:
            raise error
        if ok != comm.world_size():
            raise CheckpointError(f"{comm.world_size() - ok} other worker(s) failed {what}; see their logs. "
                                  "The checkpoint state file still names the previous checkpoint.")

    # --------------------------------------------------------------- restore

    def restore(self, sess, save_path):
        """Restores this worker's rows of every table and the replicated variables from ``save_path``.

        ``save_path`` is a full checkpoint or a delta (``...-<step>.delta``):
        a delta restores its chain, the base and then every delta in order,
        after checking every file against the manifests.

        Raises:
          CheckpointMismatchError: the checkpoint holds other shapes (a
            different model) or lacks variables of this model.
          ChainError: a delta of the chain is missing or torn (the message
            names it and the last complete step).
        """
        if self._is_empty:
            return
        if save_path is None:
            raise ValueError("Can't load save_path when it is None.")
        prefix = compat.as_text(save_path)
        if self.resume_chains and not manifest.is_delta(prefix):
            prefix = self._newest_chain_on(prefix)
        chain = manifest.verify_chain(prefix)
        if chain.deltas:
            self._check_keyed_variables(chain.deltas[-1])
            self._ensure_delta_ops()
        unpoliced = self._restore_full(sess, chain.base)
        for delta in chain.deltas:
            logger.info("Restoring incremental checkpoint %s", delta)
            reader = tf.compat.v1.train.NewCheckpointReader(delta)
            for table in self._delta_tables:
                tombstones = incremental.tombstones_key(table.name)
                if incremental.restore(sess, table, delta, self._delta_prefix,
                                       stored_row_splits(reader, {}, table.name),
                                       stored_row_splits(reader, {}, tombstones) if table.dynamic is not None else None,
                                       reader):
                    unpoliced.setdefault(table.name, table.unpoliced)
            for _, family in self._whole_in_deltas:
                hash_tables.restore(sess, family, delta, self._restore_prefix,
                                    stored_row_splits(reader, {}, family.name))
        if chain.deltas:
            sess.run(self._delta_dense_restore, {self._delta_prefix: chain.deltas[-1]})
        self._assume_usage(sess, prefix, unpoliced)
        self._start_chain(sess, chain.base)
        self._chain = chain
        self._last_restore = (weakref.ref(sess), prefix)

    def _check_keyed_variables(self, delta: str) -> None:
        """Raises :class:`CheckpointMismatchError` where ``delta`` (a chain's last) holds an ordinary variable of
        this model as keyed rows other than all its rows in order.

        A table with fewer rows than workers is an ordinary variable, restored from the chain's last delta whole;
        where that delta was written the table was sharded, and its delta holds the rows trained since the save
        before (``<table>/keys``), in the writers' order: read whole they are other rows, or another shape.
        """
        reader = tf.compat.v1.train.NewCheckpointReader(delta)
        for name in _flat_specs(self._saveables)[0]:
            shape = self._expected_shapes.get(name)
            if not shape or shape[0] is None or not reader.has_tensor(hash_tables.keys_key(name)):
                continue
            keys = reader.get_tensor(hash_tables.keys_key(name))
            if not np.array_equal(keys, np.arange(shape[0])):
                raise CheckpointMismatchError(
                    f"table {name}: delta {delta} holds {len(keys)} of its {shape[0]} rows by key, in the writers' "
                    f"order (the table was sharded where the delta was written); on {comm.world_size()} workers it "
                    "has fewer rows than workers, an ordinary variable restored whole, and those rows cannot be. "
                    f"Resume this chain on at most {shape[0]} workers and save a full checkpoint there (saver.save), "
                    "or restore the chain's full checkpoint alone")

    def last_chain(self) -> Optional[manifest.Chain]:
        """The chain the next :meth:`save_incremental` extends (None before any save or restore)."""
        return self._chain

    @staticmethod
    def _newest_chain_on(prefix: str) -> str:
        """The newest complete delta chained to the full checkpoint ``prefix`` in its folder, else ``prefix``."""
        latest = manifest.latest_incremental_checkpoint(os.path.dirname(prefix))
        if latest and manifest.is_delta(latest) and os.path.basename(manifest.verify_chain(latest).base) == \
                os.path.basename(prefix):
            logger.info("Resuming from the incremental checkpoint chain %s -> %s", prefix, latest)
            return latest
        return prefix

    def _restore_full(self, sess, prefix: str) -> dict:
        """Restores the full checkpoint ``prefix``; returns ``{table: Unpoliced}`` of policy tables it held without
        their policy state."""
        if not checkpoint_management.checkpoint_exists_internal(prefix):
            raise ValueError(f"The passed save_path is not a valid checkpoint: {prefix}")
        logger.info("Restoring parameters from %s", prefix)
        shapes = check_shapes(self._expected_shapes, prefix)
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        feed = {self._restore_prefix: prefix}
        for key, splits in self._row_splits.items():
            feed[splits] = stored_row_splits(reader, shapes, key)
        sess.run(self._restore_op, feed)
        unpoliced = {}
        for family in self._families:
            if hash_tables.restore(sess, family, prefix, self._restore_prefix,
                                   stored_row_splits(reader, shapes, family.name), reader):
                unpoliced[family.name] = family.unpoliced
        return unpoliced

    @staticmethod
    def _assume_usage(sess, prefix: str, unpoliced: dict) -> None:
        """Policy tables restored from a checkpoint written without a policy: each held key counts as admitted
        at the restored step (its counter table is empty); says so once per table."""
        for name, restore in unpoliced.items():
            step = sess.run(restore.assume)
            logger.warning("hash table %s: checkpoint %s was written without a vocabulary policy (it holds no "
                           "counts or last-seen steps); each restored key starts as admitted now: seen %d times, "
                           "last at step %d; the counter table starts empty", name, prefix,
                           max(restore.min_count, 1), step)


def _flat_specs(saveables) -> Tuple[List[str], List[str], List[tf.Tensor]]:
    """``(names, slice specs, tensors)`` of every spec of ``saveables``, in order (one ``SaveV2`` call's inputs)."""
    specs = [spec for saveable in saveables for spec in saveable.specs]
    return [spec.name for spec in specs], [spec.slice_spec for spec in specs], [spec.tensor for spec in specs]


def _plan() -> Optional[ShardingPlan]:
    """The sharding plan this process's tables were made under (None before any table)."""
    planning = sharding_runtime.active()
    return planning.plan if planning is not None else None


def default_saver() -> saver_lib.Saver:
    """The graph's saver (collection ``SAVERS``), else a new :class:`Saver` added to it (``Scaffold``'s default)."""
    savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
    if savers:
        if len(savers) > 1:
            raise RuntimeError("More than one item in collection SAVERS. Please indicate which one to use by "
                               "passing it to the constructor.")
        return savers[0]
    saver = Saver(sharded=True, allow_empty=True)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)
    return saver


def _dense_writers(sharded) -> List[int]:
    """The ranks that write a part of the sharded tables: those with a row block of at least one (a column-wise
    table with fewer rows than workers leaves some ranks none, and a rank with none writes no part)."""
    writers = set()
    for var in sharded:
        info = shard_of(var)
        bounds = layout.block_bounds(info.vocab, info.world_size)
        writers.update(s for s in range(info.world_size) if bounds[s + 1] > bounds[s])
    return sorted(writers)


def _clear_own_parts(parts_dir: str, part: str, replicated_part: str) -> None:
    """Creates ``parts_dir`` and removes the files of this worker's names left there by a killed save of this step.

    A worker writes a table's part only when it holds rows of it, and the
    merge takes every part of this world size's names that exists: a part a
    killed save left, and this save does not write again, would be merged
    with the new ones (stale rows, or ``Duplicate tensor keyed by ...``).
    Each worker removes only its own names (rank 0 also the replicated
    part), before the barrier that precedes the merge: no race.
    """
    tf.io.gfile.makedirs(parts_dir)
    own = [glob.escape(part) + "*"] + ([glob.escape(replicated_part) + "*"] if comm.rank() == 0 else [])
    stale = [f for pattern in own for f in tf.io.gfile.glob(pattern)]
    if stale:
        logger.info("removing %d file(s) of a killed save in %s", len(stale), parts_dir)
    for path in stale:
        tf.io.gfile.remove(path)


def _remove_stale_parts(parts_dir: str) -> None:
    """Removes what the merge left in ``parts_dir``: parts of a killed save of this step by another world size.

    Every worker has written its part (the first barrier) and the merge has
    consumed them, so whatever is left there belongs to no checkpoint.
    """
    if tf.io.gfile.exists(parts_dir):
        logger.info("removing the parts of an unfinished earlier save in %s", parts_dir)
        tf.io.gfile.rmtree(parts_dir)


def _attempt(step) -> Optional[BaseException]:
    try:
        step()
    except Exception as err:  # pylint: disable=broad-except  (re-raised after the barrier)
        logger.error("checkpoint step failed on rank %d: %s", comm.rank(), err)
        return err
    return None
