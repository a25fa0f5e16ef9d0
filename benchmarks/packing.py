"""What packing tables could gain: DeepFM's embedding part of a step, per table against packed, in one process.

    python -m benchmarks.packing [--batch 4096] [--scale 0.01] [--steps 20] [--repeats 5] [--warmup 5]
                                 [--variants per_table,packed] [--trace 3] [--json out.json]

One process, plain TF graph mode (world size 1, no launch). Every variant
builds the embedding part of a DeepFM training step (:mod:`modelzoo.deepfm`):
26 Criteo tables of dim ``--dim`` and 26 first-order tables of dim 1, 1%
Criteo sizes (``--scale``), one id per feature drawn from a power law, a
loss that reads every vector through a fixed linear map (no MLP: the step is
the tables), Adagrad. Variants:

- ``per_table``: ``CollectiveStrategy("hb").scope()`` around the zoo's
  ``embedding_layer`` with feature columns, as ``reports/quick``'s hb@1 runs
  it: one lookup, unique, gather, combine, gradient and update per table.
- ``per_table_variables``: the same through ``get_variable`` tables and
  ``lookup_sparse_group`` (the zoo's ``variables`` API).
- ``per_table_packing``, ``per_table_variables_packing``: the two above
  with ``COLLECTIVE_PACKING=1`` (collective's lookup-side packing, stage 1
  of docs/packing.md: one unique and one combine per group of lookups).
- ``plain_tf``: the feature-column program without collective (tuned TF:
  Grappler's arithmetic optimizer off), the baseline users run.
- ``packed_ids``: by hand, packing of the lookup side only (what the
  dispatcher can do while every table keeps its own variable): per dim
  group one id check, one unique of the ids offset per table, one
  partition of the distinct ids by table, a gather per table, one stitch,
  one sorted segment sum; the optimizer still updates each table.
- ``packed``: by hand, what packing would build: per dim group one variable
  of all its tables' rows (each table's rows at an offset), one id check,
  one unique, one gather, one sorted segment sum (a segment per sample and
  table), one sparse Adagrad apply.

Each variant gets its own graph and session (collective's session config:
arithmetic optimizer off); after ``--warmup`` steps the variants take turns,
``--steps`` steps each, ``--repeats`` times, so a loaded machine slows them
alike. Printed per variant: the median step ms (and min..max of the per-turn
medians), ops in the step's graph (total and the lookup/update op types),
graph build seconds (model + optimizer) and first-step seconds (Grappler and
initial allocation). ``--trace K`` traces K more steps per variant and prints
op ms per step by op type (:func:`benchmarks.tracing.op_times`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import statistics
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from benchmarks.tracing import op_times
from datasets import schema
from datasets.synthetic.generate import cardinalities, zipf_ranks

ZIPF_EXPONENT = 1.05
SEED = 7
BATCHES = 8  # distinct batches cycled through (held in a local variable: no feeding, no input pipeline)
VARIANTS = ("per_table", "per_table_variables", "per_table_packing", "per_table_variables_packing", "plain_tf",
            "packed_ids", "packed")
# The op types that say how the lookups and updates were built.
KEY_OPS = ("UniqueWithCounts", "Unique", "ResourceGather", "GatherV2", "SparseSegmentSum", "UnsortedSegmentSum",
           "SegmentSum", "ResourceSparseApplyAdagrad", "Assert", "DynamicPartition", "DynamicStitch")

log = logging.getLogger("benchmarks.packing")


class Variant:
    """One built step: its graph, session and train op, with the figures of its build."""

    def __init__(self, name: str, graph: tf.Graph, train_op: tf.Operation, loss: tf.Tensor, build_s: float):
        self.name, self.graph, self.train_op, self.loss, self.build_s = name, graph, train_op, loss, build_s
        self.ops = step_op_counts(graph, [train_op.name, loss.op.name])
        from collective import context  # pylint: disable=import-outside-toplevel

        config = context.session_config(tf.compat.v1.ConfigProto())
        self.session = tf.compat.v1.Session(graph=graph, config=config)
        with graph.as_default():
            self.session.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        started = time.perf_counter()
        self.session.run(train_op)
        self.first_step_s = time.perf_counter() - started
        self.step_ms: List[float] = []
        self.turn_ms: List[float] = []

    def run(self, steps: int, record: bool = True) -> None:
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            self.session.run(self.train_op)
            times.append((time.perf_counter() - started) * 1e3)
        if record:
            self.step_ms += times
            self.turn_ms.append(statistics.median(times))

    def trace(self, steps: int) -> Dict[str, float]:
        """Op ms per step by op type over ``steps`` traced steps."""
        totals: Dict[str, float] = collections.Counter()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        for _ in range(steps):
            metadata = tf.compat.v1.RunMetadata()
            self.session.run(self.train_op, options=options, run_metadata=metadata)
            totals.update(op_times(metadata.step_stats))
        return {k: v / steps / 1e3 for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def step_op_counts(graph: tf.Graph, outputs: Sequence[str]) -> Dict[str, int]:
    """Ops by type in the part of ``graph`` that ``outputs`` (op names) need, before Grappler."""
    graph_def = tf.compat.v1.graph_util.extract_sub_graph(graph.as_graph_def(), list(outputs))
    return dict(collections.Counter(node.op for node in graph_def.node))


def batches(vocabs: Sequence[int], batch: int) -> np.ndarray:
    """``[BATCHES, batch, features]`` int64 ids, one per feature and sample, from a power law."""
    rng = np.random.default_rng(SEED)
    return np.stack([np.stack([zipf_ranks(rng, batch, vocab, ZIPF_EXPONENT) for vocab in vocabs], axis=1)
                     for _ in range(BATCHES)])


def step_inputs(ids: np.ndarray) -> Tuple[tf.Tensor, tf.Tensor]:
    """This step's ``[batch, features]`` ids (cycling through ``ids``) and labels."""
    held = tf.Variable(ids, trainable=False, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], name="ids")
    step = tf.Variable(0, dtype=tf.int64, trainable=False, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                       name="step")
    at = step.assign_add(1) % ids.shape[0]
    batch_ids = tf.gather(held, at)
    labels = tf.cast(tf.reduce_sum(batch_ids, axis=1) % 2, tf.float32)
    return batch_ids, labels


def loss_of(first: tf.Tensor, second: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """DeepFM-like logit from ``[B, F, 1]`` weights and ``[B, F, d]`` vectors through fixed maps: log loss."""
    rng = np.random.default_rng(SEED + 1)
    mix = tf.constant(rng.normal(0.0, 0.1, second.shape[1:]).astype(np.float32))
    logits = tf.reduce_sum(first, axis=[1, 2]) + tf.reduce_sum(second * mix, axis=[1, 2])
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def _zoo_layers(batch_ids: tf.Tensor, vocabs: Sequence[int], dim: int, api: str, sharded: bool):
    from modelzoo.features import embedding_layer  # pylint: disable=import-outside-toplevel
    from modelzoo.spec import criteo_spec  # pylint: disable=import-outside-toplevel

    spec = criteo_spec(vocabs)
    features = {name: batch_ids[:, i] for i, name in enumerate(schema.CATEGORICAL)}
    first = embedding_layer(features, spec, 1, "first_order", SEED + 7, stddev=0.01, sharded=sharded, api=api)
    second = embedding_layer(features, spec, dim, "embedding", SEED, sharded=sharded, api=api)
    return first, second


def packed_lookup(batch_ids: tf.Tensor, vocabs: Sequence[int], dim: int, scope: str, stddev: float) -> tf.Tensor:
    """``[B, F, dim]``: every feature's table in one variable (table ``t``'s rows from ``offsets[t]``), one
    id check, one unique, one gather and one sorted segment sum (a segment per sample and feature)."""
    offsets = np.concatenate([[0], np.cumsum(vocabs)[:-1]]).astype(np.int64)
    features = len(vocabs)
    with tf.compat.v1.variable_scope(scope):
        table = tf.compat.v1.get_variable(
            "packed", [int(sum(vocabs)), dim], use_resource=True,
            initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev, seed=SEED))
    valid = tf.reduce_all(tf.logical_and(batch_ids >= 0, batch_ids < tf.constant(vocabs, tf.int64)))
    check = tf.debugging.Assert(valid, [f"{scope}: an id outside its table's vocabulary"])
    with tf.control_dependencies([check]):
        keys = tf.reshape(batch_ids + offsets, [-1])
    found = tf.unique_with_counts(keys, out_idx=tf.int32)
    rows = tf.gather(table, found.y)
    segments = tf.range(tf.size(keys, out_type=tf.int32))  # one id per sample and feature: segment b * F + f
    combined = tf.sparse.segment_sum(rows, found.idx, segments)
    return tf.reshape(combined, [-1, features, dim])


def packed_ids_lookup(batch_ids: tf.Tensor, vocabs: Sequence[int], dim: int, scope: str,
                      stddev: float) -> tf.Tensor:
    """``[B, F, dim]`` from one variable per feature, with the lookup side packed: one id check, one unique of
    the offset ids, one partition of the distinct ids by table, a gather per table, one stitch, one segment sum."""
    offsets = np.concatenate([[0], np.cumsum(vocabs)[:-1]]).astype(np.int64)
    features = len(vocabs)
    with tf.compat.v1.variable_scope(scope):
        tables = [tf.compat.v1.get_variable(
            f"C{t + 1}", [vocab, dim], use_resource=True,
            initializer=tf.compat.v1.truncated_normal_initializer(stddev=stddev, seed=SEED * 1000 + t))
            for t, vocab in enumerate(vocabs)]
    valid = tf.reduce_all(tf.logical_and(batch_ids >= 0, batch_ids < tf.constant(vocabs, tf.int64)))
    check = tf.debugging.Assert(valid, [f"{scope}: an id outside its table's vocabulary"])
    with tf.control_dependencies([check]):
        keys = tf.reshape(batch_ids + offsets, [-1])
    found = tf.unique_with_counts(keys, out_idx=tf.int32)
    which = tf.cast(tf.searchsorted(tf.constant(offsets), found.y, side="right") - 1, tf.int32)
    positions = tf.dynamic_partition(tf.range(tf.size(found.y, out_type=tf.int32)), which, features)
    local = tf.dynamic_partition(found.y, which, features)
    rows = tf.dynamic_stitch(positions, [tf.gather(table, ids - int(offset))
                                         for table, ids, offset in zip(tables, local, offsets)])
    segments = tf.range(tf.size(keys, out_type=tf.int32))
    combined = tf.sparse.segment_sum(rows, found.idx, segments)
    return tf.reshape(combined, [-1, features, dim])


@contextlib.contextmanager
def packing_env(on: bool) -> Iterator[None]:
    """``COLLECTIVE_PACKING`` set to ``1`` or ``0`` for the block (collective reads it when lookups are built)."""
    from collective import context  # pylint: disable=import-outside-toplevel

    previous = os.environ.get("COLLECTIVE_PACKING")
    os.environ["COLLECTIVE_PACKING"] = "1" if on else "0"
    context.reset()
    try:
        yield
    finally:
        if previous is None:
            del os.environ["COLLECTIVE_PACKING"]
        else:
            os.environ["COLLECTIVE_PACKING"] = previous
        context.reset()


def build(name: str, ids: np.ndarray, vocabs: Sequence[int], dim: int, learning_rate: float) -> Variant:
    """The variant ``name``'s step in a new graph."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(SEED)
        batch_ids, labels = step_inputs(ids)
        started = time.perf_counter()
        if name in ("packed", "packed_ids"):
            packer = packed_lookup if name == "packed" else packed_ids_lookup
            first = packer(batch_ids, vocabs, 1, "first_order", 0.01)
            second = packer(batch_ids, vocabs, dim, "embedding", dim ** -0.5)
            loss = loss_of(first, second, labels)
            train_op = tf.compat.v1.train.AdagradOptimizer(learning_rate).minimize(loss)
        elif name == "plain_tf":
            loss = loss_of(*_zoo_layers(batch_ids, vocabs, dim, "feature_columns", False), labels)
            train_op = tf.compat.v1.train.AdagradOptimizer(learning_rate).minimize(loss)
        else:
            from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

            api = "variables" if name.startswith("per_table_variables") else "feature_columns"
            with packing_env(name.endswith("_packing")), CollectiveStrategy("hb").scope():
                loss = loss_of(*_zoo_layers(batch_ids, vocabs, dim, api, True), labels)
                train_op = tf.compat.v1.train.AdagradOptimizer(learning_rate).minimize(loss)
        build_s = time.perf_counter() - started
    return Variant(name, graph, train_op, loss, build_s)


def summary(variants: Sequence[Variant], batch: int) -> List[Dict[str, Any]]:
    rows = []
    for v in variants:
        ms = statistics.median(v.step_ms)
        rows.append({"variant": v.name, "step_ms": ms, "turn_ms_min": min(v.turn_ms), "turn_ms_max": max(v.turn_ms),
                     "samples_per_s": batch / ms * 1e3, "ops": sum(v.ops.values()),
                     "key_ops": {k: v.ops[k] for k in KEY_OPS if k in v.ops},
                     "build_s": v.build_s, "first_step_s": v.first_step_s})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--scale", type=float, default=0.01, help="table sizes: Criteo Kaggle's times this")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="steps per turn")
    parser.add_argument("--repeats", type=int, default=5, help="turns per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--trace", type=int, default=0, help="traced steps per variant (0: none)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tf.compat.v1.disable_eager_execution()
    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    vocabs = cardinalities(args.scale)
    ids = batches(vocabs, args.batch)
    variants = [build(n, ids, vocabs, args.dim, args.learning_rate) for n in names]
    for v in variants:
        v.run(args.warmup, record=False)
    for _ in range(args.repeats):
        for v in variants:
            v.run(args.steps)
    rows = summary(variants, args.batch)
    for row in rows:
        log.info("%-20s step %7.2f ms (turns %.2f..%.2f)  %8.0f samples/s  ops %5d  build %.2f s  first step "
                 "%.2f s  %s", row["variant"], row["step_ms"], row["turn_ms_min"], row["turn_ms_max"],
                 row["samples_per_s"], row["ops"], row["build_s"], row["first_step_s"], row["key_ops"])
    if args.trace:
        for v, row in zip(variants, rows):
            row["trace_ms"] = v.trace(args.trace)
            top = ", ".join(f"{k} {ms:.1f}" for k, ms in list(row["trace_ms"].items())[:12])
            log.info("%-20s traced op ms/step: all %.1f; %s", v.name, sum(row["trace_ms"].values()), top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "variants": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
