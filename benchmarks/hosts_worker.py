"""Worker of the hosts benchmark (:mod:`benchmarks.hosts`): ``python -m collective.launch --hosts ... -m
benchmarks.hosts_worker OUT_DIR STEPS BATCH VOCAB DIM``.

One hb table, nothing else to train: every step each worker looks up its ``BATCH`` ids (:func:`ids_of`, Zipf,
the same on every run) and SGD updates the rows, so the only bytes on the wire are the exchange's and Horovod's
coordination. Local rank 0 of each host reads its host's link counters (``/sys/class/net/chosts``) before and
after the timed steps; each worker writes ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import numpy as np
import tensorflow as tf

from collective import CollectiveStrategy, comm
from collective.embedding.exchanges import hierarchical

WARMUP = 3
LINK = "/sys/class/net/chosts/statistics"


def ids_of(step: int, rank: int, batch: int, vocab: int) -> np.ndarray:
    """The ids rank ``rank`` looks up at ``step``: Zipf(1.2) over ``vocab`` (popular ids on every worker)."""
    rng = np.random.default_rng(1000 * step + rank)
    return (rng.zipf(1.2, batch) - 1) % vocab


def _link() -> dict:
    if not os.path.isdir(LINK):
        return {}
    return {k: int(open(os.path.join(LINK, k), encoding="ascii").read()) for k in
            ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}


def main(out: str, steps: int, batch: int, vocab: int, dim: int) -> None:
    strategy = CollectiveStrategy("hb")
    r, n = strategy.rank(), strategy.world_size()
    with strategy.scope(), tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [batch])
        with strategy.embedding_scope():
            table = tf.compat.v1.get_variable("table", [vocab, dim], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * 0.001)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        barrier = comm.allreduce(tf.constant([1.0]), "sum")
        counter = comm.bytes_counter()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for step in range(WARMUP):
                sess.run(train, {ids: ids_of(step, r, batch, vocab)})
            sess.run(barrier)
            before, counted, start = _link(), sess.run(counter), time.perf_counter()
            for step in range(WARMUP, WARMUP + steps):
                sess.run(train, {ids: ids_of(step, r, batch, vocab)})
            sess.run(barrier)
            seconds, after, counted = time.perf_counter() - start, _link(), sess.run(counter) - counted
    group = hierarchical.route()
    record = {"rank": r, "size": n, "host": socket.gethostname(), "seconds": seconds, "steps": steps,
              "batch": batch, "vocab": vocab, "dim": dim, "warmup": WARMUP, "counted_bytes": int(counted),
              "hierarchical": group is not None, "link": {k: after[k] - before[k] for k in before}}
    with open(os.path.join(out, f"rank{r}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]))
