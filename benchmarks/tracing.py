"""Where a training step's time goes: op time by op type from TensorFlow's step traces, and whole-table reads.

:class:`StepTracer` is a ``SessionRunHook`` that runs steps ``first ..
first + count - 1`` with ``RunOptions(trace_level=FULL_TRACE)`` and sums each
op's time by op type (:func:`op_times`), per step. ``python -m
benchmarks.profile`` runs it on chosen modes of a configuration; the report
shows the result (:func:`table_rows`).

:class:`TableReads` counts, in the graphs TensorFlow runs for one step (after
Grappler), the ops that read a whole embedding table (:func:`whole_table_reads`);
every benchmark record carries the count.

Op time is the sum of every op's own duration on all of the process's
threads, so it can exceed the step's wall time when ops overlap, and a
collective's time includes its wait for the other workers. Tracing slows a
step down; compare shares, not absolute times.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set

import tensorflow as tf


def op_type(node_stats) -> str:
    """The op type of one traced node: ``timeline_label`` reads ``name = Type(inputs)``."""
    label = node_stats.timeline_label
    if " = " in label:
        return label.split(" = ", 1)[1].split("(", 1)[0].strip() or node_stats.node_name
    return node_stats.node_name.split(":")[0]


def op_times(step_stats) -> Dict[str, float]:
    """Microseconds of op time per op type in one traced step (``RunMetadata.step_stats``)."""
    totals: Dict[str, float] = {}
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            kind = op_type(node)
            if kind in ("_SOURCE", "_SINK"):
                continue
            totals[kind] = totals.get(kind, 0.0) + float(node.op_end_rel_micros - node.op_start_rel_micros)
    return totals


class StepTracer(tf.compat.v1.train.SessionRunHook):
    """Traces ``count`` steps from step ``first`` on (0-based) and sums op time per type."""

    def __init__(self, first: int, count: int):
        self._first, self._count = first, count
        self._step = 0
        self._started = 0.0
        self.totals: Dict[str, float] = {}
        self.wall_us: List[float] = []

    def _tracing(self) -> bool:
        return self._first <= self._step < self._first + self._count

    def before_run(self, run_context):
        if not self._tracing():
            return None
        self._started = time.perf_counter()
        return tf.compat.v1.train.SessionRunArgs(
            None, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        if self._tracing():
            self.wall_us.append((time.perf_counter() - self._started) * 1e6)
            for kind, us in op_times(run_values.run_metadata.step_stats).items():
                self.totals[kind] = self.totals.get(kind, 0.0) + us
        self._step += 1

    def summary(self) -> Dict[str, Any]:
        """``{"steps", "wall_ms" (per traced step, median), "op_ms" {type: ms per step}}``."""
        steps = max(len(self.wall_us), 1)
        walls = sorted(self.wall_us)
        return {"steps": len(self.wall_us), "wall_ms": walls[len(walls) // 2] / 1e3 if walls else 0.0,
                "op_ms": {k: v / steps / 1e3 for k, v in sorted(self.totals.items(), key=lambda kv: -kv[1])}}


def whole_table_reads(graph_defs: Iterable, tables: Set[str]) -> int:
    """``ReadVariableOp`` nodes of the variables whose handle ops are named ``tables``, in ``graph_defs``.

    A sparse lookup reads rows (``ResourceGather``); a ``ReadVariableOp`` of a table reads all of it, and an
    optimizer update of the table in the same step then copies it (copy-on-write of the buffer the read holds).
    """
    count = 0
    for graph_def in graph_defs:
        for node in graph_def.node:
            if node.op == "ReadVariableOp" and node.input and node.input[0].split(":")[0].lstrip("^") in tables:
                count += 1
    return count


class TableReads(tf.compat.v1.train.SessionRunHook):
    """:func:`whole_table_reads` of the graphs step ``at`` (0-based) runs, for the tables ``tables()`` names."""

    def __init__(self, at: int, tables: Callable[[], Set[str]]):
        self._at, self._tables = at, tables
        self._names: Set[str] = set()
        self._step = 0
        self.count: Optional[int] = None

    def begin(self):
        self._names = set(self._tables())

    def before_run(self, run_context):
        if self._step != self._at:
            return None
        return tf.compat.v1.train.SessionRunArgs(None, options=tf.compat.v1.RunOptions(output_partition_graphs=True))

    def after_run(self, run_context, run_values):
        if self._step == self._at:
            self.count = whole_table_reads(run_values.run_metadata.partition_graphs, self._names)
        self._step += 1


def table_rows(profile: Mapping[str, Any], top: int = 8) -> List[Dict[str, Any]]:
    """The ``top`` op types of one rank's :meth:`StepTracer.summary` with their share of the op time."""
    ops = profile["op_ms"]
    total = sum(ops.values()) or 1.0
    rows = [{"op type": kind, "ms/step": ms, "share": ms / total}
            for kind, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:top]]
    rows.append({"op type": "(all ops)", "ms/step": total, "share": 1.0})
    return rows
