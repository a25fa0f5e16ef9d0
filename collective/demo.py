"""The main job on the embedded defaults: ``make demo``.

Runs a sharded-id exchange across ``--workers`` processes started by the
launcher and reports what moved. Later issues grow this into the model zoo's
DLRM on synthetic data with both backends.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def _worker(out_dir: str) -> None:
    import numpy as np
    import tensorflow as tf

    from collective import comm

    r, n = comm.rank(), comm.world_size()
    rng = np.random.default_rng(r)
    ids = rng.zipf(1.2, size=4096).astype(np.int64) % 100_000
    with tf.Graph().as_default():
        unique, _ = tf.unique(tf.constant(ids))
        owner = tf.cast(unique % n, tf.int32)
        order = tf.argsort(owner, stable=True)
        splits = tf.math.bincount(owner, minlength=n, maxlength=n)
        received, received_splits = comm.alltoall(tf.gather(unique, order), splits)
        counter = comm.bytes_counter()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            got, split_values = sess.run([received, received_splits])
            sent = sess.run(counter)
    assert np.all(got % n == r), "an id reached a worker that does not own it"
    with open(os.path.join(out_dir, f"rank{r}.txt"), "w") as f:
        f.write(f"{len(ids)} {len(np.unique(ids))} {len(got)} {sent} {' '.join(map(str, split_values))}\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collective.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_out:
        _worker(args.worker_out)
        return 0
    with tempfile.TemporaryDirectory() as out:
        code = subprocess.call([sys.executable, "-m", "collective.launch", "-n", str(args.workers),
                                "-m", "collective.demo", "--worker-out", out])
        if code != 0:
            return code
        print(f"\nid exchange across {args.workers} workers (Zipf ids, vocabulary 100,000):")
        print(f"{'rank':>4} {'ids':>6} {'unique':>7} {'owned':>6} {'bytes sent':>11}  received from each rank")
        for r in range(args.workers):
            ids, unique, owned, sent, *splits = open(os.path.join(out, f"rank{r}.txt")).read().split()
            print(f"{r:>4} {ids:>6} {unique:>7} {owned:>6} {sent:>11}  {' '.join(splits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
