"""Runs every model-zoo recipe on tiny layers for each backend; rank 0 writes <model>-<backend>-n<N>.npz.

argv: out_dir criteo_dir movielens_dir token [token ...]
  token: backend[+export][+example] or backend+estimator[+resume][+export].
  backend: hb, sok or plain (the TensorFlow baseline); "+export" also exports a SavedModel (raw feature
  inputs; with "+example" serialized tf.Example inputs, and the same checkpoint once more with raw inputs
  under MODEL_DIR/export_raw). "+estimator" trains DLRM alone with --engine estimator (<dlrm>-<backend>-est-n<N>).
  "+resume" (with "+estimator") runs the command with --steps 4, then the same command again with --steps 8
  in the same model_dir (<dlrm>-<backend>-est-resume-n<N>; the first run's metrics in ...-first.json).
Every run saves its last checkpoint; the sok and estimator runs (whose model dirs the tests read) also save
one every 4 of the 8 steps and write events every 4 steps.
"""

import json
import os
import sys

import numpy as np

from collective import context
from collective.integration.export import export_estimator
from modelzoo import deepfm, dlrm, movielens, runner
from modelzoo.features import serving_input_receiver_fn

out_dir, criteo_dir, movielens_dir, tokens = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
COMMON = ["--batch_size", "32", "--steps", "8", "--log_every", "0", "--shuffle_buffer", "0", "--seed", "3"]
EVERY_4 = ["--save_checkpoints_steps", "4", "--save_summary_steps", "4"]
MODELS = {
    "dlrm": (dlrm.RECIPE, ["--data", criteo_dir, "--embedding_dim", "4", "--bottom_mlp", "8,4", "--top_mlp", "8,1",
                           "--learning_rate", "0.1"]),
    "deepfm": (deepfm.RECIPE, ["--data", criteo_dir, "--embedding_dim", "4", "--dnn", "8", "--learning_rate", "0.1"]),
    "movielens": (movielens.RECIPE, ["--data", movielens_dir, "--embedding_dim", "4", "--learning_rate", "0.05"]),
}
n, rank = context.get().world_size, context.get().rank


def export_raw_too(recipe, args, model_dir):
    """Exports the run's last checkpoint once more with raw feature inputs (rank 0 writes)."""
    dataset = recipe.load_data(args, rank)
    params = recipe.params(args, dataset)
    params.setdefault("seed", args.seed)
    return export_estimator(recipe.model_fn, params, None, os.path.join(model_dir, "export_raw"),
                            serving_input_receiver_fn(dataset.spec, "raw"), model_dir)


for token in tokens:
    backend, options = token.split("+")[0], set(token.split("+")[1:])
    estimator = "estimator" in options
    for name, (recipe, flags) in MODELS.items():
        if estimator and name != "dlrm":
            continue
        resume = "resume" in options
        model_dir = os.path.join(out_dir, f"{name}-{backend}-{'est-' if estimator else ''}"
                                          f"{'resume-' if resume else ''}n{n}")
        backend_flags = ["--plain"] if backend == "plain" else ["--backend", backend]
        export_flags = [] if "export" in options else ["--export_dir", "none"]
        if "example" in options:
            export_flags += ["--serving_input", "example"]
        engine_flags = ["--engine", "estimator"] if estimator else []
        if estimator or backend == "sok":
            engine_flags += EVERY_4
        argv = COMMON + flags + backend_flags + export_flags + engine_flags + ["--model_dir", model_dir]
        if resume:  # the same command, first with half the steps: the second run resumes from its checkpoint
            first = runner.run(recipe, runner.parse(recipe, argv + ["--steps", "4"]))
            if rank == 0:
                with open(model_dir + "-first.json", "w") as f:
                    json.dump(first, f)
        args = runner.parse(recipe, argv)
        metrics = runner.run(recipe, args, keep_predictions=not estimator)
        predictions = metrics.pop("_predictions", None) or {}
        if "example" in options:
            raw = export_raw_too(recipe, args, model_dir)
            metrics["export_raw_path"] = raw.decode() if raw else None
        if rank == 0:
            np.savez(model_dir + ".npz", **predictions)
            with open(model_dir + ".json", "w") as f:
                json.dump(metrics, f)
