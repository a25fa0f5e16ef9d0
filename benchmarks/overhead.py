"""What collective adds to every step, apart from the lookups: measured on an empty step.

    python -m benchmarks.overhead [--workers 1,2] [--steps 400] [--out reports/quick]

For each worker count it launches ``python -m collective.launch -n N -m
benchmarks.overhead --worker OUT`` and times a step that does almost nothing
(one 16-float update) under ``CollectiveStrategy("hb").scope()``, once bare
(``MonitoredSession`` without hooks) and once with each per-step cost the
library can add:

- ``heartbeat``: :class:`collective.runtime.heartbeat.HeartbeatHook`'s step lines (a background thread
  writes the newest one when steps come faster than ``STEP_LINE_INTERVAL``);
- ``checkpoint_flag``: the allreduce :class:`collective.integration.session.CheckpointSaverHook` runs
  after every step so that a save (by time) or a preemption starts on all workers or none;
- ``loss_allreduce``: the allreduce of the loss the Estimator wrapper adds to the step (its logged loss
  is the global mean);
- ``throughput``: :class:`collective.integration.hooks.ThroughputHook` (the progress line every 100 steps,
  with its own allreduce of the byte counter at each line).

The medians over ``--steps`` steps and their difference to ``bare`` go to
``OUT/overhead.json``; the report puts them beside the measured step times.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

from benchmarks.launching import ROOT, launch_command, worker_env

VARIANTS = ("bare", "heartbeat", "checkpoint_flag", "loss_allreduce", "throughput")
FILE = "overhead.json"
_WARMUP = 20


def _time_variant(variant: str, steps: int, checkpoint_dir: str) -> float:
    """Median seconds per step of ``variant`` on this worker (every worker runs the same steps)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from collective import CollectiveStrategy, comm, context  # pylint: disable=import-outside-toplevel
    from collective.integration.hooks import ThroughputHook  # pylint: disable=import-outside-toplevel
    from collective.integration.session import CheckpointSaverHook  # pylint: disable=import-outside-toplevel
    from collective.runtime.heartbeat import HeartbeatHook  # pylint: disable=import-outside-toplevel

    with tf.Graph().as_default(), CollectiveStrategy("hb").scope():
        step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.get_variable("w", [16], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_sum(weights * weights)
        fetch: Any = tf.group(weights.assign_add(tf.fill([16], 1e-3)), step.assign_add(1))
        hooks: List = []
        if variant == "heartbeat":
            hooks = [HeartbeatHook()]
        elif variant == "checkpoint_flag":
            hooks = [CheckpointSaverHook(checkpoint_dir, save_steps=10 ** 9)]
        elif variant == "throughput":
            hooks = [ThroughputHook(every_n_steps=100, batch_size=1)]
        elif variant == "loss_allreduce":
            fetch = [fetch, comm.allreduce(loss, "average")]
        creator = tf.compat.v1.train.ChiefSessionCreator(config=context.session_config())
        times = []
        with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
            for _ in range(_WARMUP + steps):
                started = time.perf_counter()
                sess.run(fetch)
                times.append(time.perf_counter() - started)
    return statistics.median(times[_WARMUP:])


def worker(out_dir: str, steps: int) -> None:
    """Times every variant on this worker; rank 0 writes ``out_dir/rank0.json``."""
    from collective import comm  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        medians = {v: _time_variant(v, steps, os.path.join(tmp, v)) for v in VARIANTS}
    if comm.rank() == 0:
        with open(os.path.join(out_dir, "rank0.json"), "w") as f:
            json.dump(medians, f)


def measure(workers: Sequence[int], steps: int) -> Dict[str, Any]:
    """``{"steps", "rows": [{workers, variant, median_us, added_us}]}`` over launches of ``workers`` each."""
    rows = []
    for n in workers:
        with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
            cmd = launch_command(n, "benchmarks.overhead", "--worker", tmp, "--steps", str(steps))
            env = worker_env()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
            with open(os.path.join(tmp, "rank0.json")) as f:
                medians = json.load(f)
        rows += [{"workers": n, "variant": v, "median_us": medians[v] * 1e6,
                  "added_us": (medians[v] - medians["bare"]) * 1e6} for v in VARIANTS]
    return {"steps": steps, "rows": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    parser.add_argument("--steps", type=int, default=400, help="timed steps per variant (default 400)")
    parser.add_argument("--out", default=os.path.join("reports", "quick"), help="report directory")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # set by the launch itself
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.worker:
        worker(args.worker, args.steps)
        return 0
    result = measure([int(n) for n in args.workers.split(",")], args.steps)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, FILE), "w") as f:
        json.dump(result, f, indent=1)
    for row in result["rows"]:
        print(f"N={row['workers']} {row['variant']:<16} {row['median_us']:9.1f} us/step "
              f"({row['added_us']:+8.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
