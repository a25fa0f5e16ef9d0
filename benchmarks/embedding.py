"""Sharded-embedding benchmark: samples/s and bytes/sample of a Criteo-shaped lookup+update step.

    python -m benchmarks.embedding [--backends hb,sok] [--workers 1,2,3] [--batch_size 3072]
                                   [--scale 0.001] [--steps 10] [--repeats 5] [--warmup 5] [--per_table]

For each backend and world size, starts the workers through the real
launcher (``python -m collective.launch``). Each worker builds
:func:`build_embedding_step` (26 sharded tables of Criteo Kaggle's sizes
times ``--scale``, dim 16, one id per feature drawn from a power law, 13
dense features, a small MLP, Adagrad with sparse table updates), runs
``--warmup`` steps, then ``--repeats`` timed runs of ``--steps`` steps.
Prints, per backend and world size, the median samples/s over the repeats
(global samples over the slowest worker's time) and the bytes all workers
sent per sample (``collective.comm``'s counter: embedding exchanges and the
dense gradient allreduce). ``--batch_size`` is the global batch: each of N
workers reads ``batch_size / N`` rows per step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from datasets import schema
from datasets.synthetic.generate import cardinalities as criteo_cardinalities
from datasets.synthetic.generate import zipf_ranks
from benchmarks.launching import launch_command
from collective.byte_model import bytes_per_sample
from collective.cli import add_flag

logger = logging.getLogger("benchmarks.embedding")

DIM = 16
HIDDEN = 64
ZIPF_EXPONENT = 1.05


@dataclasses.dataclass
class EmbeddingStep:
    """One built lookup+update step: run ``train_op`` with ``feed(rng)`` (a fresh batch each call)."""

    train_op: tf.Operation
    loss: tf.Tensor
    tables: List[tf.Variable]
    batch_size: int
    feed: Callable[[np.random.Generator], Dict[tf.Tensor, np.ndarray]]


def build_embedding_step(batch_size: int, vocab_sizes: Optional[Sequence[int]] = None, dim: int = DIM,
                         strategy=None, grouped: bool = True, learning_rate: float = 0.05) -> EmbeddingStep:
    """Builds the Criteo-shaped step in the default graph.

    Args:
      batch_size: samples per step (on this worker).
      vocab_sizes: rows of each of the 26 tables (default: Criteo Kaggle's times 0.001).
      dim: embedding dimension.
      strategy: a ``CollectiveStrategy`` whose ``scope()`` is active: tables are
        made in its ``embedding_scope()``; None builds plain TensorFlow.
      grouped: look all tables up in one grouped exchange
        (``collective.embedding.lookup.lookup_sparse_group``) rather than one per table.
      learning_rate: Adagrad's.
    """
    vocab_sizes = list(vocab_sizes or criteo_cardinalities(0.001))
    features = len(vocab_sizes)
    ids = tf.compat.v1.placeholder(tf.int64, [None, features], name="categorical")
    dense = tf.compat.v1.placeholder(tf.float32, [None, len(schema.DENSE)], name="dense")
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="label")
    scope = strategy.embedding_scope() if strategy is not None else tf.compat.v1.variable_scope("embeddings")
    with scope:
        tables = [tf.compat.v1.get_variable(f"table_{i}", [vocab, dim],
                                            initializer=tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=i))
                  for i, vocab in enumerate(vocab_sizes)]
    rows = tf.range(tf.shape(ids, out_type=tf.int64)[0])
    indices = tf.stack([rows, tf.zeros_like(rows)], axis=1)
    shape = tf.stack([tf.shape(ids, out_type=tf.int64)[0], tf.constant(1, tf.int64)])
    sp_ids = [tf.SparseTensor(indices, ids[:, i], shape) for i in range(features)]
    if grouped and strategy is not None:
        from collective.embedding.lookup import lookup_sparse_group  # pylint: disable=import-outside-toplevel

        vectors = lookup_sparse_group(tables, sp_ids, combiners=["sum"] * features)
    else:
        vectors = [tf.nn.embedding_lookup_sparse(t, s, None, combiner="sum") for t, s in zip(tables, sp_ids)]
    x = tf.concat(vectors + [dense], axis=1)
    x = tf.compat.v1.layers.dense(x, HIDDEN, activation=tf.nn.relu, name="hidden")
    logits = tf.compat.v1.layers.dense(x, 1, name="logit")
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf.compat.v1.train.AdagradOptimizer(learning_rate).minimize(loss)

    def feed(rng: np.random.Generator) -> Dict[tf.Tensor, np.ndarray]:
        batch_ids = np.stack([zipf_ranks(rng, batch_size, vocab, ZIPF_EXPONENT) for vocab in vocab_sizes], axis=1)
        return {ids: batch_ids, dense: rng.normal(size=(batch_size, len(schema.DENSE))).astype(np.float32),
                labels: rng.integers(0, 2, (batch_size, 1)).astype(np.float32)}

    return EmbeddingStep(train_op, loss, tables, batch_size, feed)


# ---------------------------------------------------------------- worker

def run_worker(args: argparse.Namespace) -> None:
    """Times the step on this worker and writes ``rank<r>.json`` into ``args.out``."""
    from collective import CollectiveStrategy, comm  # pylint: disable=import-outside-toplevel

    strategy = CollectiveStrategy(args.backend)
    rank = strategy.rank()
    rng = np.random.default_rng(1000 + rank)
    with strategy.scope(), tf.Graph().as_default():
        step = build_embedding_step(args.batch_size // strategy.world_size(), criteo_cardinalities(args.scale), strategy=strategy,
                                    grouped=not args.per_table)
        counter = comm.bytes_counter()
        # Batches are made before timing: the benchmark times the step, not the generator.
        feeds = [step.feed(rng) for _ in range(min(args.steps, 8))]
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for i in range(args.warmup):
                sess.run(step.train_op, feeds[i % len(feeds)])
            seconds, sent = [], []
            for _ in range(args.repeats):
                before = sess.run(counter)
                start = time.perf_counter()
                for i in range(args.steps):
                    sess.run(step.train_op, feeds[i % len(feeds)])
                seconds.append(time.perf_counter() - start)
                sent.append(int(sess.run(counter) - before))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"seconds": seconds, "bytes": sent}, f)


# ---------------------------------------------------------------- driver

@dataclasses.dataclass
class Result:
    backend: str
    workers: int
    samples_per_s: float
    bytes_per_sample: float


def measure(backend: str, workers: int, args: argparse.Namespace) -> Result:
    """Runs the workers through the launcher and reduces their timings."""
    with tempfile.TemporaryDirectory(prefix="bench-embedding-") as out:
        flags = ["--worker", "--out", out, "--backend", backend, "--batch_size", str(args.batch_size),
                 "--scale", str(args.scale), "--steps", str(args.steps), "--repeats", str(args.repeats),
                 "--warmup", str(args.warmup)] + (["--per_table"] if args.per_table else [])
        cmd = launch_command(workers, "benchmarks.embedding", *flags)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        ranks = []
        for r in range(workers):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    samples = args.batch_size * args.steps
    rates = [samples / max(rank["seconds"][i] for rank in ranks) for i in range(args.repeats)]
    sent = [bytes_per_sample(sum(rank["bytes"][i] for rank in ranks), samples) for i in range(args.repeats)]
    return Result(backend, workers, statistics.median(rates), statistics.median(sent))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.embedding", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="hb,sok", help="comma-separated backends (default hb,sok)")
    parser.add_argument("--workers", default="1,2,3", help="comma-separated world sizes (default 1,2,3)")
    add_flag(parser, "--batch_size", type=int, default=3072,
             help="global batch: each of N workers reads batch_size / N rows per step (default 3072)")
    parser.add_argument("--scale", type=float, default=0.001, help="table sizes: Criteo Kaggle's times this")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (the median is reported)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    add_flag(parser, "--per_table", action="store_true", help="one exchange per table instead of grouped")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="hb", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("batch_size", "steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    if args.scale <= 0:
        parser.error(f"--scale={args.scale} must be > 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    sizes = [int(n) for n in args.workers.split(",") if n.strip()]
    uneven = [n for n in sizes if args.batch_size % n]
    if uneven:
        raise SystemExit(f"--batch_size {args.batch_size} is the global batch: it must divide evenly among "
                         f"{', '.join(map(str, uneven))} workers")
    runs = [(b, n) for b in backends for n in sizes]
    results = []
    for k, (backend, workers) in enumerate(runs, 1):
        logger.info("[%d/%d] %s on %d worker(s) ...", k, len(runs), backend, workers)
        start = time.perf_counter()
        results.append(measure(backend, workers, args))
        logger.info("[%d/%d] %s on %d worker(s): %.0f samples/s (%.0f s)", k, len(runs), backend, workers,
                    results[-1].samples_per_s, time.perf_counter() - start)
    mode = "per-table" if args.per_table else "grouped"
    print(f"Criteo-shaped lookup+update step, {mode} exchange, global batch {args.batch_size}, dim {DIM}, "
          f"tables = Criteo Kaggle x {args.scale} ({sum(criteo_cardinalities(args.scale)):,} rows), "
          f"median of {args.repeats} x {args.steps} steps")
    print(f"{'backend':<8}{'workers':>8}{'samples/s':>14}{'bytes/sample':>15}")
    for res in results:
        print(f"{res.backend:<8}{res.workers:>8}{res.samples_per_s:>14,.0f}{res.bytes_per_sample:>15,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
