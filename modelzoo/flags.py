"""The command line every ``train.py`` shares; help texts print the real defaults."""

from __future__ import annotations

import argparse
import os
from typing import Mapping, Optional, Sequence

from collective.embedding import exchanges
from modelzoo.engine import ENGINES
from modelzoo.features import SERVING_INPUTS
from modelzoo.heads import OPTIMIZERS


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each flag's default after its help text, from the parser itself (never out of date), once:
    a help text that already says its default, or a flag without one, is left as it is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            return text  # says it already, has none, or is an on/off switch
        return super()._get_help_string(action)


def int_list(text: str) -> Sequence[int]:
    """``"512,256,64"`` -> ``[512, 256, 64]``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer sizes, "
                                         "e.g. 512,256,64") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least one layer size, all >= 1")
    return values


def parser(prog: str, description: str, defaults: Mapping[str, object]) -> argparse.ArgumentParser:
    """The shared flags; ``defaults`` holds the model's own (``batch_size``, ``steps``, ``learning_rate``,
    ``optimizer``, ``shuffle_buffer``, ``model_dir``)."""
    p = argparse.ArgumentParser(prog=prog, description=description.replace("``", ""), formatter_class=_Formatter)
    p.add_argument("--backend", choices=exchanges.names(),
                   default=os.environ.get("COLLECTIVE_STRATEGY", "hb").strip().lower() or "hb",
                   help="embedding exchange (default from COLLECTIVE_STRATEGY, else hb)")
    p.add_argument("--data", default=None,
                   help=defaults["data_help"])
    p.add_argument("--batch_size", type=int, default=defaults["batch_size"],
                   help="global batch size: each of N workers reads batch_size / N rows per step")
    p.add_argument("--steps", type=int, default=defaults["steps"], help="training steps")
    p.add_argument("--learning_rate", type=float, default=defaults["learning_rate"], help="learning rate")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=defaults["optimizer"], help="optimizer")
    p.add_argument("--model_dir", default=defaults["model_dir"],
                   help="checkpoints (model.ckpt-STEP), TensorBoard events (loss and samples/s; evaluation "
                        "metrics in eval/), metrics.json and the export")
    p.add_argument("--save_checkpoints_steps", type=int, default=1000,
                   help="also save a checkpoint every this many steps (0: none); the last step is always saved")
    p.add_argument("--save_summary_steps", type=int, default=100,
                   help="write loss and samples/s events every this many steps (0: none)")
    p.add_argument("--export_dir", default=None,
                   help="base directory of the exported SavedModel (default: MODEL_DIR/export); "
                        "'none' skips the export")
    p.add_argument("--serving_input", choices=SERVING_INPUTS, default="raw",
                   help="the SavedModel's input: raw (one tensor per feature), example (one string tensor "
                        "'examples' of serialized tf.Example, as TF Serving clients send, which also gets "
                        "Estimator's classification/regression signatures) or criteo_raw (DLRM, DeepFM on --data "
                        "from python -m datasets.criteo: Criteo's TSV fields as strings, the vocabulary and "
                        "numeric transform inside the SavedModel); see docs/modelzoo.md")
    p.add_argument("--eval", action=argparse.BooleanOptionalAction, default=True,
                   help="evaluate on the test rows after training")
    p.add_argument("--eval_batches", type=int, default=0,
                   help="evaluate on at most this many global batches of the test rows (0: all of them)")
    p.add_argument("--shuffle_buffer", type=int, default=defaults["shuffle_buffer"],
                   help="rows shuffled together when reading training data (0: file order)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights, shuffling and data")
    p.add_argument("--log_every", type=int, default=100,
                   help="progress: off a terminal (a pipe, under the launcher) a line every this many steps; "
                        "0: no progress bar")
    p.add_argument("--engine", choices=ENGINES, default="session",
                   help="session: train, evaluate and export in one session per worker (exact global metrics); "
                        "estimator: strategy.estimator(...) with checkpoints in --model_dir")
    p.add_argument("--plain", action="store_true",
                   help="train plain TensorFlow in one process without CollectiveStrategy (the baseline)")
    p.add_argument("--verbose", action="store_true",
                   help="show TensorFlow's and absl's info and warning lines (hidden by default)")
    return p


def check(args: argparse.Namespace, world_size: int, p: Optional[argparse.ArgumentParser] = None) -> None:
    """Rejects flag values that cannot run, saying which flag to change."""
    def fail(message: str):
        if p is not None:
            p.error(message)
        raise ValueError(message)

    if args.batch_size < world_size or args.batch_size % world_size:
        fail(f"--batch_size {args.batch_size} must be a positive multiple of the {world_size} workers")
    if args.steps < 1:
        fail(f"--steps {args.steps} must be at least 1")
    for flag in ("save_checkpoints_steps", "save_summary_steps"):
        if getattr(args, flag) < 0:
            fail(f"--{flag} {getattr(args, flag)} must be >= 0")
    if args.learning_rate <= 0:
        fail(f"--learning_rate {args.learning_rate} must be > 0")
    if args.plain and world_size > 1:
        fail("--plain is the single-process baseline; run it without collective.launch")


def add_synthetic(p: argparse.ArgumentParser) -> None:
    """Flags of the synthetic Criteo-shaped data generated when ``--data`` is not given."""
    g = p.add_argument_group("synthetic data (without --data)")
    g.add_argument("--rows", type=int, default=262_144, help="training rows to generate")
    g.add_argument("--eval_rows", type=int, default=65_536, help="test rows to generate")
    g.add_argument("--scale", type=float, default=0.01,
                   help="table sizes as a fraction of Criteo Kaggle's (also for --data without a meta.json)")
    g.add_argument("--row_group_size", type=int, default=8192,
                   help="rows per Parquet row group (workers share row groups)")


def add_embedding_dim(p: argparse.ArgumentParser, default: int = 16, stddev: float = 0.01) -> None:
    """``--embedding_dim`` and ``--embedding_stddev`` (the tables' truncated normal initialiser)."""
    p.add_argument("--embedding_dim", type=int, default=default, help="dimension of every embedding table")
    p.add_argument("--embedding_stddev", type=float, default=stddev,
                   help="standard deviation of the embeddings' initial values: small, so that ids seen rarely "
                        "or never in training add little noise to the interactions")
