"""The stream benchmark: ten days of drifting Criteo-shaped ids through a hash-table vocabulary, with and without
admission and eviction.

    python -m benchmarks.stream [--days 10] [--samples_per_day 98304] [--workers 2] [--out reports/stream]

Every day has a head of popular ids per field that drifts (a share of it is
new each day, and popularity moves within it) and a long tail of ids seen
exactly once. Labels come from a hidden weight per head id, so only the
head can be learnt. Each variant (:data:`VARIANTS`) trains the same model
(one hash table over all fields, a small MLP, Adagrad) one pass per day on
``--workers`` workers started by the launcher; before training day ``d + 1``
it predicts that day (inference lookups: keys the table does not hold read
the default) and the next-day AUC is computed from every worker's
predictions. Per day and variant: rows held per worker, table memory per
worker (held rows and the allocated state), process RSS, samples/s and
next-day AUC go to ``OUT/stream.json``; :mod:`benchmarks.stream_report`
writes ``OUT/REPORT.md`` and ``OUT/stream.png``.

Each worker generates the whole day from the seed and takes its share of
every global batch, so the data is the same on any number of workers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from benchmarks.launching import ROOT, launch_command, worker_env

logger = logging.getLogger("benchmarks.stream")
FILE = "stream.json"
FIELDS = 8
DIM = 8
HEAD = 2000              # popular ids per field and day
NEW_HEAD_SHARE = 0.3     # share of the head that is new each day
TAIL_SHARE = 0.25        # share of occurrences that are ids seen once
GLOBAL_BATCH = 1024
FIELD_BITS = 44
TAIL_BASE = 1 << 40


def variants(steps_per_day: int) -> Dict[str, Dict[str, Any]]:
    """The vocabulary policies compared: ``hash_embedding_variable`` keyword arguments by variant name.

    ``capacity_per_worker`` in a variant overrides the run's (which holds every key of the run).
    """
    return {
        "unbounded": {},
        "admission+eviction": {"min_count": 2, "steps_to_live": 2 * steps_per_day,
                               "evict_every_steps": steps_per_day},
        "admission+lru (small table)": {"min_count": 2, "counter_capacity": 4 * FIELDS * HEAD,
                                          "counter_steps_to_live": max(1, steps_per_day // 4),
                                          "evict_strategy": "lru", "evict_every_steps": max(1, steps_per_day // 8),
                                          "capacity_per_worker": FIELDS * HEAD},
    }


def day_data(day: int, samples: int, seed: int = 2026) -> Dict[str, np.ndarray]:
    """``{"keys": [samples, FIELDS] int64, "labels": [samples] float32}`` of ``day`` (the same on every worker)."""
    rng = np.random.default_rng([seed, day])
    zipf = rng.zipf(1.15, size=(samples, FIELDS))
    ranks = np.where(zipf > HEAD, rng.integers(0, HEAD, size=zipf.shape), zipf - 1)
    head_ids = _head_id(day, ranks)
    tail = rng.random((samples, FIELDS)) < TAIL_SHARE
    tail_ids = TAIL_BASE + day * samples * FIELDS + np.arange(samples * FIELDS).reshape(samples, FIELDS)
    ids = np.where(tail, tail_ids, head_ids)
    keys = (np.arange(FIELDS, dtype=np.int64)[None, :] << FIELD_BITS) + ids
    weights = np.where(tail, 0.0, _hidden_weight(keys))
    logits = weights.sum(axis=1) + rng.normal(0.0, 0.5, samples) - 0.5
    labels = (rng.random(samples) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    return {"keys": keys.astype(np.int64), "labels": labels}


def _head_id(day: int, ranks: np.ndarray) -> np.ndarray:
    """The id of popularity rank ``ranks`` in ``day``'s head: ids ``[day * shift, day * shift + HEAD)``.

    An id's rank is ``(id * 7919) % HEAD`` for as long as it stays in the head, so popular ids stay popular
    while the head drifts by ``shift`` new ids a day.
    """
    start = day * int(NEW_HEAD_SHARE * HEAD)
    residue = (ranks * pow(7919, -1, HEAD)) % HEAD
    return start + (residue - start) % HEAD


def _hidden_weight(keys: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random weight in [-0.8, 0.8] per key."""
    h = (keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (h.astype(np.float64) / float(1 << 24) - 0.5) * 1.6


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic, ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranked = np.empty(len(scores))
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0
    ranked[order] = np.repeat(average, counts)
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranked[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(out_dir: str, variant: str, days: int, samples: int, capacity: int) -> None:
    """Trains ``variant`` day by day on this worker; writes ``out_dir/rank<r>.json`` and its next-day predictions."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective import CollectiveStrategy, comm, context  # pylint: disable=import-outside-toplevel
    from collective.embedding import hash_table  # pylint: disable=import-outside-toplevel

    rank, size = comm.rank(), comm.world_size()
    local = GLOBAL_BATCH // size
    steps_per_day = samples // GLOBAL_BATCH
    policy = dict(variants(steps_per_day)[variant])
    capacity = policy.pop("capacity_per_worker", capacity)
    strategy = CollectiveStrategy("hb")
    with tf.Graph().as_default(), strategy.scope():
        tf.compat.v1.set_random_seed(2026)  # the dense layers start alike on any number of workers
        step = tf.compat.v1.train.get_or_create_global_step()
        keys = tf.compat.v1.placeholder(tf.int64, [None, FIELDS])
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        with strategy.embedding_scope():
            table = hash_table.hash_embedding_variable(
                "ids", DIM, capacity, initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=7),
                **policy)

        def logits_of(embedded):
            hidden = tf.compat.v1.layers.dense(tf.reshape(embedded, [-1, FIELDS * DIM]), 64, tf.nn.relu,
                                               name="hidden", reuse=tf.compat.v1.AUTO_REUSE)
            return tf.reshape(tf.compat.v1.layers.dense(hidden, 1, name="out", reuse=tf.compat.v1.AUTO_REUSE), [-1])

        logits = logits_of(tf.nn.embedding_lookup(table, keys))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step)
        with hash_table.inference():
            predictions = tf.sigmoid(logits_of(tf.nn.embedding_lookup(table, keys)))
        index = hash_table.table_of(table)
        held = index.size()
        slots = max(1, len([v for v in tf.compat.v1.global_variables() if v.shape == table.shape]) - 1)
        row_bytes = DIM * 4 * (1 + slots)
        allocated = sum(int(np.prod(v.shape)) * v.dtype.size for v in tf.compat.v1.global_variables()
                        if v.shape.is_fully_defined() and (v.shape == table.shape or v in index.variables))
        with tf.compat.v1.Session(config=context.session_config()) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            records: List[Dict[str, Any]] = []
            for day in range(days):
                data = day_data(day, samples)
                started = time.perf_counter()
                losses = []
                for s in range(steps_per_day):
                    rows = slice(s * GLOBAL_BATCH + rank * local, s * GLOBAL_BATCH + (rank + 1) * local)
                    losses.append(sess.run([loss, train_op], {keys: data["keys"][rows], labels: data["labels"][rows]})[0])
                seconds = time.perf_counter() - started
                record = {"day": day, "samples_per_s": steps_per_day * GLOBAL_BATCH / seconds,
                          "loss": float(np.mean(losses)), "losses": [float(x) for x in losses],
                          "rows_held": int(sess.run(held)), "rss_bytes": _rss_bytes(), "allocated_bytes": allocated}
                record["table_bytes"] = record["rows_held"] * row_bytes
                if day + 1 < days:
                    nxt = day_data(day + 1, samples)
                    preds = []
                    for s in range(steps_per_day):
                        rows = slice(s * GLOBAL_BATCH + rank * local, s * GLOBAL_BATCH + (rank + 1) * local)
                        preds.append(sess.run(predictions, {keys: nxt["keys"][rows]}))
                    np.save(os.path.join(out_dir, f"pred-{variant}-d{day}-r{rank}.npy"), np.concatenate(preds))
                records.append(record)
                logger.info("rank %d %s day %d: %d rows held, %.0f samples/s", rank, variant, day,
                            record["rows_held"], record["samples_per_s"])
    with open(os.path.join(out_dir, f"{variant}-rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(records, f)


def _next_day_auc(out_dir: str, variant: str, day: int, workers: int, samples: int) -> float:
    """AUC of every worker's predictions of day ``day + 1``, against that day's labels in global-batch order."""
    labels = day_data(day + 1, samples)["labels"]
    local = GLOBAL_BATCH // workers
    preds = [np.load(os.path.join(out_dir, f"pred-{variant}-d{day}-r{r}.npy")) for r in range(workers)]
    ordered = np.concatenate([p[s * local:(s + 1) * local] for s in range(samples // GLOBAL_BATCH) for p in preds])
    return auc(labels[:len(ordered)], ordered)


def measure(workers: int, days: int, samples: int, capacity: int, names: Sequence[str]) -> Dict[str, Any]:
    """Launches one job per variant; ``{"config": ..., "rows": [per day and variant, with per-worker lists]}``."""
    rows = []
    for variant in names:
        with tempfile.TemporaryDirectory(prefix="stream-") as tmp:
            cmd = launch_command(workers, "benchmarks.stream", "--worker", tmp, "--variant", variant, "--days",
                                 str(days), "--samples_per_day", str(samples), "--capacity", str(capacity))
            env = worker_env()
            print(f"stream: {variant} on {workers} workers, {days} days of {samples} samples", flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
            per_rank = []
            for r in range(workers):
                with open(os.path.join(tmp, f"{variant}-rank{r}.json"), encoding="utf-8") as f:
                    per_rank.append(json.load(f))
            for day in range(days):
                day_rows = [ranks[day] for ranks in per_rank]
                rows.append({
                    "variant": variant, "day": day,
                    "rows_held": [d["rows_held"] for d in day_rows],
                    "table_bytes": [d["table_bytes"] for d in day_rows],
                    "allocated_bytes": [d["allocated_bytes"] for d in day_rows],
                    "rss_bytes": [d["rss_bytes"] for d in day_rows],
                    "samples_per_s": min(d["samples_per_s"] for d in day_rows),
                    "next_day_auc": _next_day_auc(tmp, variant, day, workers, samples) if day + 1 < days else None,
                })
                print(f"  day {day}: rows/worker {rows[-1]['rows_held']}, {rows[-1]['samples_per_s']:.0f} samples/s,"
                      f" next-day AUC {rows[-1]['next_day_auc']}", flush=True)
    config = {"workers": workers, "days": days, "samples_per_day": samples, "capacity_per_worker": capacity,
              "fields": FIELDS, "dim": DIM, "head": HEAD, "new_head_share": NEW_HEAD_SHARE,
              "tail_share": TAIL_SHARE, "global_batch": GLOBAL_BATCH,
              "variants": {name: variants(samples // GLOBAL_BATCH)[name] for name in names}}
    return {"config": config, "rows": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--samples_per_day", type=int, default=96 * GLOBAL_BATCH)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=0,
                        help="capacity_per_worker (default: every distinct key of the run fits on one worker)")
    parser.add_argument("--variants", default=None, help="comma-separated variant names (default: all)")
    parser.add_argument("--out", default=os.path.join("reports", "stream"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.worker else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.samples_per_day % GLOBAL_BATCH:
        parser.error(f"--samples_per_day must be a multiple of the global batch {GLOBAL_BATCH}")
    capacity = args.capacity or int(1.1 * args.days * (args.samples_per_day * FIELDS * TAIL_SHARE
                                                          + FIELDS * HEAD)) // args.workers + 1024
    if args.worker:
        worker(args.worker, args.variant, args.days, args.samples_per_day, capacity)
        return 0
    names = args.variants.split(",") if args.variants else list(variants(1))
    result = measure(args.workers, args.days, args.samples_per_day, capacity, names)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, FILE), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    from benchmarks import stream_report  # pylint: disable=import-outside-toplevel
    print(stream_report.write(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
