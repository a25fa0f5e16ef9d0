"""The restart tests' model, inputs and progress lines, shared by their workers and the test.

One graph holds checkpoint_cases' dense model (sharded tables ``t1``, ``t2``
and a dense layer, trained with Adam: the same variables, initial values and
updates as ``checkpoint_cases.build``, so ``checkpoint_cases.reference`` is
its uninterrupted result) and checkpoint_cases' hash-table vocabulary
``item`` (trained with Adagrad). Every step feeds one global batch, split into
contiguous per-worker shares, and only the dense optimizer counts the global
step.

Workers print ``rank R started at step S`` when their session exists and
``rank R step S`` once the checkpoint of step ``S`` is complete; a worker told
to hold prints ``rank R holding ...`` and sleeps there, so the test kills it
at a known point and sees where the rerun resumed.
"""

import os
import time
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

try:
    import checkpoint_cases as cc  # a worker: tests/workers is on sys.path
    import embedding_cases as cases
except ImportError:
    from workers import checkpoint_cases as cc
    from workers import embedding_cases as cases

HASH_LEARNING_RATE = 0.3
# How long a held worker sleeps: far longer than the test takes to kill it.
HOLD_SECONDS = 300
# name: (dtype, columns) of each input; "label" is the dense model's label.
INPUTS = {"ids": (tf.int64, 2), "sp": (tf.int64, 3), "weights": (tf.float32, 3), "label": (tf.float32, 1),
          "keys": (tf.int64, 2), "targets": (tf.float32, 1)}


def global_inputs(step: int) -> Dict[str, np.ndarray]:
    """Step ``step``'s global batch: checkpoint_cases' serving inputs and label, and its hash batch."""
    inputs = cc.serving_inputs(step)
    inputs["label"] = cases.global_batch(step)[2]
    inputs["keys"], inputs["targets"] = cc.hash_batch(step)
    return inputs


def local_inputs(step: int, rank: int, size: int) -> Dict[str, np.ndarray]:
    """Worker ``rank``'s contiguous share of step ``step``'s global batch."""
    per = cases.BATCH // size
    return {key: value[rank * per:(rank + 1) * per] for key, value in global_inputs(step).items()}


def placeholders() -> Dict[str, tf.Tensor]:
    """One placeholder per input."""
    return {key: tf.compat.v1.placeholder(dtype, [None, cols], name=key) for key, (dtype, cols) in INPUTS.items()}


def _dense_variables(strategy) -> None:
    """Makes ``t1``, ``t2``, ``w`` and ``b`` with embedding_cases' initial values (``cc.forward`` reuses them)."""
    with strategy.embedding_scope():
        for name, seed in (("t1", 1), ("t2", 2)):
            tf.compat.v1.get_variable(name, [cases.VOCAB, cases.DIM],
                                      initializer=tf.compat.v1.constant_initializer(cases.table_values(seed)))
    tf.compat.v1.get_variable("w", [3 * cases.DIM, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.3, 0.3, 3 * cases.DIM).reshape(-1, 1)))
    tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())


def build(inputs: Dict[str, tf.Tensor], strategy):
    """Both models on ``inputs``; returns (loss, train_op). ``train_op`` also adds 1 to the global step."""
    _dense_variables(strategy)
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=tf.compat.v1.AUTO_REUSE):
        logits = cc.forward(inputs["ids"], inputs["sp"], inputs["weights"], strategy)
    dense_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=inputs["label"], logits=logits))
    hash_loss = tf.reduce_mean(tf.square(cc.hash_forward(inputs["keys"], strategy) - inputs["targets"]))
    step = tf.compat.v1.train.get_or_create_global_step()
    dense_vars = [v for v in tf.compat.v1.trainable_variables() if v.op.name in ("t1", "t2", "w", "b")]
    hash_vars = [v for v in tf.compat.v1.trainable_variables() if v.op.name == "item"]
    train_op = tf.group(
        cases.make_optimizer(cc.OPTIMIZER).minimize(dense_loss, global_step=step, var_list=dense_vars),
        tf.compat.v1.train.AdagradOptimizer(HASH_LEARNING_RATE).minimize(hash_loss, var_list=hash_vars))
    return dense_loss + hash_loss, train_op


def write_pid(pid_dir: str, rank: int) -> None:
    """Writes this process's id to ``<pid_dir>/rank<rank>.pid`` (the test kills and checks workers by it)."""
    os.makedirs(pid_dir, exist_ok=True)
    path = os.path.join(pid_dir, f"rank{rank}.pid")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def checkpoint_step(model_dir: str) -> int:
    """The global step of the latest checkpoint in ``model_dir``; 0 when there is none."""
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def parse_hold(arg: Optional[str]) -> Optional[Tuple[int, int]]:
    """``"R:S"`` (worker R holds at step S) as ``(R, S)``; None for no argument."""
    if not arg:
        return None
    rank, step = arg.split(":")
    return int(rank), int(step)


class Progress:
    """Prints the progress lines; ``hold=(R, S)`` makes worker R sleep at step S until the test kills it."""

    def __init__(self, rank: int, hold: Optional[Tuple[int, int]] = None):
        self.rank, self.hold = rank, hold
        self.started: Optional[int] = None

    def start(self, step: int) -> None:
        self.started = step
        print(f"rank {self.rank} started at step {step}", flush=True)

    def step(self, step: int) -> None:
        print(f"rank {self.rank} step {step}", flush=True)

    def hold_if_due(self, step: int, where: str) -> None:
        """Worker R at step S: prints ``rank R holding <where> step S`` and sleeps (the others wait for it)."""
        if self.hold == (self.rank, step):
            print(f"rank {self.rank} holding {where} step {step}", flush=True)
            time.sleep(HOLD_SECONDS)
