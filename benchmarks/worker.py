"""Benchmark runs' worker: ``python -m collective.launch -n N -m benchmarks.worker SPECS OUT_DIR``.

SPECS is a JSON file with a list of runs' parameters (see
:func:`benchmarks.config.matrix`), run one after another in this process;
for run ``i`` each worker writes ``OUT_DIR/<i>/rank<r>.json`` (step times,
bytes, memory) and ``OUT_DIR/<i>/rank<r>.npz`` (evaluation probabilities and
labels). Peak memory is the process's: with several runs per launch it is
the peak so far.

Modes:
  hb, sok          ``CollectiveStrategy`` with the tables in ``embedding_scope()``.
  tf_single        plain TensorFlow in one process.
  hvd_replicated   every table replicated, ``hvd.DistributedOptimizer`` (sparse
                   gradients allgathered, dense ones allreduced). Horovod's
                   own ops are not counted by ``collective.comm``: the step adds
                   to the same counter what they send under its byte model.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from typing import Any, Dict, List

import numpy as np
import tensorflow as tf

from benchmarks import batches, models
from collective import comm, context
from collective.byte_model import sent_bytes
from collective.embedding.table import shard_of
from datasets import schema

logger = logging.getLogger("benchmarks.worker")
MODES = ("hb", "sok", "tf_single", "hvd_replicated")
_COLUMNS = frozenset(schema.CATEGORICAL)


def _placeholders(batch_size: int):
    features = {"dense": tf.compat.v1.placeholder(tf.float32, [batch_size, len(schema.DENSE)], name="dense")}
    for name in schema.CATEGORICAL:
        features[name] = tf.compat.v1.placeholder(tf.int64, [batch_size, 1], name=name)
    labels = tf.compat.v1.placeholder(tf.float32, [batch_size], name="labels")
    return features, labels


def _feed(features, labels, batch: batches.Columns) -> Dict[tf.Tensor, np.ndarray]:
    feed = {features["dense"]: batch["dense"], labels: batch["label"]}
    for name in schema.CATEGORICAL:
        feed[features[name]] = batch[name][:, None]
    return feed


def _nbytes(t) -> tf.Tensor:
    return tf.size(t, out_type=tf.int64) * t.dtype.size


def horovod_bytes(local_grads, n: int) -> tf.Tensor:
    """Bytes this worker sends for ``hvd.DistributedOptimizer``'s gradient exchange, under comm's byte model."""
    total = tf.constant(0, tf.int64)
    for grad, _ in local_grads:
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices):
            total += sent_bytes("allgather", _nbytes(grad.values) + _nbytes(grad.indices), n)
        else:
            total += sent_bytes("allreduce", _nbytes(grad), n)
    return total


def _is_embedding(var: tf.Variable) -> bool:
    """A table or its optimizer slot: sharded, a feature column's ``embedding_weights``, or named after a column."""
    if shard_of(var) is not None or "embedding_weights" in var.name:
        return True
    return any(part in _COLUMNS for part in var.name.split(":")[0].split("/"))


def _variable_bytes(var: tf.Variable) -> int:
    return int(var.shape.num_elements()) * var.dtype.size


def build(spec: Dict[str, Any]):
    """The run's graph pieces: (train_op, probs, placeholders, extra init ops)."""
    mode, n = spec["mode"], comm.world_size()
    builder = models.get(spec["model"])
    tf.compat.v1.set_random_seed(int(spec["seed"]))
    features, labels = _placeholders(int(spec["batch_size"]))
    if mode in ("hb", "sok"):
        from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

        strategy = CollectiveStrategy(mode)
        loss, probs = builder(features, labels, spec, strategy.embedding_scope)
        opt = tf.compat.v1.train.AdagradOptimizer(float(spec["learning_rate"]))
        train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        return train_op, probs, features, labels, []
    loss, probs = builder(features, labels, spec, models.no_scope)
    opt = tf.compat.v1.train.AdagradOptimizer(float(spec["learning_rate"]))
    if mode == "tf_single":
        return opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step()), probs, \
            features, labels, []
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    hvd.init()
    local = opt.compute_gradients(loss)
    distributed = hvd.DistributedOptimizer(opt)
    averaged = distributed.compute_gradients(loss)
    count = comm.bytes_counter().assign_add(horovod_bytes(local, n), read_value=False)
    with tf.control_dependencies([count]):
        train_op = distributed.apply_gradients(averaged, global_step=tf.compat.v1.train.get_or_create_global_step())
    return train_op, probs, features, labels, [hvd.broadcast_global_variables(0)]


def run(spec: Dict[str, Any], out_dir: str) -> None:
    """Trains, times and evaluates one configuration on this worker; writes its results."""
    r, n = comm.rank(), comm.world_size()
    b = int(spec["batch_size"])
    distinct = int(spec["train_batches"])
    train = batches.synthetic_rows(distinct * n * b, float(spec["scale"]), int(spec["seed"]))
    evaluation = batches.synthetic_rows(int(spec["eval_rows"]), float(spec["scale"]), int(spec["seed"]) + 1000)
    shard, real = batches.eval_shard(evaluation, r, n, b)
    with tf.Graph().as_default():
        if spec["mode"] in ("hb", "sok"):
            from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel

            scope = CollectiveStrategy(spec["mode"]).scope()
        else:
            scope = models.no_scope()
        with scope:
            train_op, probs, features, labels, after_init = build(spec)
            counter = comm.bytes_counter()
            tables = [v for v in tf.compat.v1.global_variables() if _is_embedding(v)]
            dense = [v for v in tf.compat.v1.trainable_variables() if not _is_embedding(v)]
            config = context.session_config(tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=int(os.environ.get("TF_NUM_INTRAOP_THREADS", 0)),
                inter_op_parallelism_threads=int(os.environ.get("TF_NUM_INTEROP_THREADS", 0))))
            with tf.compat.v1.Session(config=config) as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                sess.run(after_init)
                feeds = [_feed(features, labels, batches.worker_batch(train, k, r, n, b)) for k in range(distinct)]
                step = 0
                for _ in range(int(spec["warmup"])):
                    sess.run(train_op, feeds[step % distinct])
                    step += 1
                before = int(sess.run(counter))
                times: List[List[float]] = []
                for _ in range(int(spec["repeats"])):
                    repeat = []
                    for _ in range(int(spec["steps"])):
                        start = time.perf_counter()
                        sess.run(train_op, feeds[step % distinct])
                        repeat.append(time.perf_counter() - start)
                        step += 1
                    times.append(repeat)
                sent = int(sess.run(counter)) - before
                outputs = []
                for start in range(0, len(shard["label"]), b):
                    outputs.append(sess.run(probs, _feed(features, labels, batches.take(shard, start, start + b))))
    timed = int(spec["repeats"]) * int(spec["steps"])
    result = {
        "rank": r,
        "world_size": n,
        "step_times": times,
        "bytes_sent": sent,
        "bytes_per_step": sent / max(timed, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "embedding_bytes": sum(_variable_bytes(v) for v in tables),
        "dense_param_bytes": [_variable_bytes(v) for v in dense],
    }
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(result, f)
    np.savez(os.path.join(out_dir, f"rank{r}.npz"), probs=np.concatenate(outputs)[:real], labels=shard["label"][:real])


def main(argv: List[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if len(argv) != 2:
        print("usage: python -m collective.launch -n N -m benchmarks.worker SPECS.json OUT_DIR", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        specs = json.load(f)
    for spec in specs:
        if spec.get("mode") not in MODES:
            print(f"{argv[0]}: mode {spec.get('mode')!r} is not one of {', '.join(MODES)}", file=sys.stderr)
            return 2
    context.get()
    for i, spec in enumerate(specs):
        out = os.path.join(argv[1], str(i))
        os.makedirs(out, exist_ok=True)
        run(spec, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
