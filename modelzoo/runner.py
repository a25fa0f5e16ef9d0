"""What every ``train.py`` runs: flags -> data -> engine -> metrics.json and one JSON line.

A model is a :class:`Recipe`: its ``model_fn``, its own flags, how it finds
its data, and how flags become ``params``. Output (rank 0): a progress bar
while training (a line every ``--log_every`` steps off a terminal), then one
JSON line with the metrics, also written to ``MODEL_DIR/metrics.json`` with
the training loss of every step (``loss_curve``); the engine writes checkpoints and
TensorBoard events to ``MODEL_DIR`` as well.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
from typing import Callable, Dict, Mapping, Optional, Sequence

from collective import CollectiveStrategy, context
from collective.runtime import logs
import collective.data
from modelzoo import data as data_lib
from modelzoo import flags
from modelzoo.engine import RunResult, make_engine
from modelzoo.features import serving_input_receiver_fn

logger = logging.getLogger("modelzoo")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One model of the zoo.

    Attributes:
      name: the model's name (``dlrm``).
      description: the first line of its ``--help``.
      model_fn: ``model_fn(features, labels, mode, params)``.
      defaults: the model's defaults for the shared flags (see :func:`modelzoo.flags.parser`).
      add_flags: adds the model's own flags.
      load_data: ``(args, rank) -> DataSet``.
      params: ``(args, dataset) -> params`` for ``model_fn``.
    """

    name: str
    description: str
    model_fn: Callable
    defaults: Mapping[str, object]
    add_flags: Callable[[argparse.ArgumentParser], None]
    load_data: Callable[[argparse.Namespace, int], data_lib.DataSet]
    params: Callable[[argparse.Namespace, data_lib.DataSet], Dict[str, object]]


def parse(recipe: Recipe, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The recipe's flags, checked for this job's world size."""
    p = flags.parser(f"{recipe.name}/train.py", recipe.description, recipe.defaults)
    recipe.add_flags(p)
    args = p.parse_args(argv)
    flags.check(args, context.get().world_size, p)
    return args


def eval_plan(files, batch_per_worker: int, world_size: int, rank: int, max_batches: int):
    """``(steps, rows)``: batches every worker runs (the most any worker needs) and this worker's rows."""
    counts = [collective.data.count_rows(files, rank=r, world_size=world_size) for r in range(world_size)]
    steps = max(math.ceil(c / batch_per_worker) for c in counts)
    rows = counts[rank]
    if max_batches:
        steps = min(steps, max_batches)
        rows = min(rows, steps * batch_per_worker)
    return steps, rows


def run(recipe: Recipe, args: argparse.Namespace, keep_predictions: bool = False) -> Dict[str, object]:
    """Trains, evaluates and exports as ``args`` say; returns the metrics (rank 0 writes them)."""
    strategy = None if args.plain else CollectiveStrategy(args.backend)
    n, rank = (strategy.world_size(), strategy.rank()) if strategy else (1, 0)
    dataset = recipe.load_data(args, rank)
    logger.info("%s on %d worker(s), backend %s: %s", recipe.name, n, "plain" if args.plain else args.backend,
                dataset.description)
    params = recipe.params(args, dataset)
    params.setdefault("seed", args.seed)
    per_worker = args.batch_size // n
    train_fn = data_lib.input_fn(dataset.train, dataset.spec, per_worker, num_epochs=None,
                                 shuffle_buffer=args.shuffle_buffer, seed=args.seed, rank=rank, world_size=n)
    eval_fn, eval_steps, eval_rows = None, 0, 0
    if args.eval:
        eval_steps, eval_rows = eval_plan(dataset.test, per_worker, n, rank, args.eval_batches)
        if args.engine == "estimator":  # one pass over each worker's rows: the Estimator pads uneven shares
            eval_fn = data_lib.input_fn(dataset.test, dataset.spec, per_worker, num_epochs=1, rank=rank,
                                        world_size=n)
            eval_steps = args.eval_batches
        else:  # a worker without test rows still runs every batch (the lookups are collective): it reads rank 0's
            eval_fn = data_lib.input_fn(dataset.test, dataset.spec, per_worker, num_epochs=None,
                                        rank=rank if eval_rows else 0, world_size=n)
    export_base = None if (args.export_dir or "").lower() == "none" else (
        args.export_dir or os.path.join(args.model_dir, "export"))
    engine = make_engine(args.engine, strategy, recipe.model_fn, args.model_dir, params,
                         save_checkpoints_steps=args.save_checkpoints_steps,
                         save_summary_steps=args.save_summary_steps)
    result: RunResult = engine.run(train_fn, args.steps, args.batch_size, eval_input_fn=eval_fn,
                                   eval_steps=eval_steps, eval_rows=eval_rows, export_dir_base=export_base,
                                   serving_input_receiver_fn=serving_input_receiver_fn(dataset.spec,
                                                                                       args.serving_input, args.data),
                                   log_every=args.log_every, keep_predictions=keep_predictions)
    metrics: Dict[str, object] = {
        "model": recipe.name, "backend": "plain" if args.plain else args.backend, "workers": n,
        "steps": result.steps, "batch_size": args.batch_size, "optimizer": args.optimizer,
        "learning_rate": args.learning_rate, **result.metrics, "train_loss": result.train_loss,
        "samples_per_sec": result.samples_per_sec, "bytes_per_sample": result.bytes_per_sample,
        "export_path": result.export_path, "data": dataset.description,
        "loss_curve": {"steps": [s for s, _ in result.losses], "losses": [v for _, v in result.losses]}}
    if rank == 0:
        os.makedirs(args.model_dir, exist_ok=True)
        with open(os.path.join(args.model_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
    if keep_predictions:
        metrics["_predictions"] = result.predictions
    return metrics


def main(recipe: Recipe, argv: Optional[Sequence[str]] = None) -> int:
    """The ``train.py`` command line: prints the metrics as one JSON line on rank 0 (the loss curve only
    in metrics.json). TensorFlow's logs are quiet unless ``--verbose`` (:mod:`collective.runtime.logs`; its C++
    lines only if set before TensorFlow loaded, as :func:`modelzoo.script.script_main` does)."""
    args = parse(recipe, argv)
    logs.configure(args.verbose)
    metrics = run(recipe, args)
    if context.get().rank == 0:
        print(json.dumps({k: v for k, v in metrics.items() if k != "loss_curve"}), flush=True)
    return 0
