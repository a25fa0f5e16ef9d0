"""What the incremental-checkpoint row marking (collective.checkpoint.touched) costs per training step.

    PYTHONPATH=. python scripts/touched_overhead.py [--rows 2000000] [--dim 8] [--batch 4096] [--steps 200]

One process, ``CollectiveStrategy("hb").scope()``: a ``[rows, dim]`` sharded
table looked up by ``batch`` random ids, a sum loss, trained with Adagrad
(marks the gradient's rows) and with Adam (marks every row). Each optimizer
is timed with the marking as built and with ``touched.mark`` returning no
ops, the two sessions alternating in rounds; the medians of ``--steps``
steps (``--adam-steps`` for Adam) and their difference are logged and
printed as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import numpy as np
import tensorflow as tf

from collective import CollectiveStrategy
from collective.checkpoint import touched

logger = logging.getLogger("touched_overhead")
_WARMUP = 20


def _build(optimizer: str, marking: bool, rows: int, dim: int):
    """A graph training a ``[rows, dim]`` table with ``optimizer``; returns (graph, train op, ids placeholder)."""
    original = touched.mark
    if not marking:
        touched.mark = lambda *args, **kwargs: []
    try:
        graph = tf.Graph()
        with graph.as_default(), CollectiveStrategy("hb").scope() as strategy:
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            with strategy.embedding_scope():
                table = tf.compat.v1.get_variable("t", [rows, dim], initializer=tf.compat.v1.zeros_initializer())
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
            make = {"adagrad": tf.compat.v1.train.AdagradOptimizer, "adam": tf.compat.v1.train.AdamOptimizer}
            train = make[optimizer](0.01).minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
        return graph, train, ids, init
    finally:
        touched.mark = original


def _median_steps(optimizer: str, rows: int, dim: int, batch: int, steps: int, rounds: int = 5) -> dict:
    """Median seconds per step without and with marking, timed in alternating rounds (a shared machine drifts)."""
    feeds = [np.random.default_rng(s).integers(0, rows, batch) for s in range(8)]
    runs = {}
    for marking in (False, True):
        graph, train, ids, init = _build(optimizer, marking, rows, dim)
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(init)
        for s in range(_WARMUP):
            sess.run(train, {ids: feeds[s % len(feeds)]})
        runs[marking] = (sess, train, ids, [])
    for _ in range(rounds):
        for sess, train, ids, times in runs.values():
            for s in range(max(1, steps // rounds)):
                began = time.perf_counter()
                sess.run(train, {ids: feeds[s % len(feeds)]})
                times.append(time.perf_counter() - began)
    result = {marking: statistics.median(times) for marking, (_, _, _, times) in runs.items()}
    for sess, _, _, _ in runs.values():
        sess.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--adam-steps", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = {"rows": args.rows, "dim": args.dim, "batch": args.batch, "steps": args.steps, "adam_steps": args.adam_steps}
    for optimizer in ("adagrad", "adam"):
        medians = _median_steps(optimizer, args.rows, args.dim, args.batch,
                                args.steps if optimizer == "adagrad" else args.adam_steps)
        off, on = medians[False], medians[True]
        result[optimizer] = {"off_ms": round(off * 1e3, 3), "on_ms": round(on * 1e3, 3),
                             "marking_ms": round((on - off) * 1e3, 3)}
        logger.info("%s: %.3f ms/step without marking, %.3f ms with (%+.3f ms)", optimizer, off * 1e3, on * 1e3,
                    (on - off) * 1e3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
