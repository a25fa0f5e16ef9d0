"""Runs every model-zoo recipe on tiny layers for each backend; rank 0 writes <model>-<backend>-n<N>.npz.

argv: out_dir criteo_dir movielens_dir backend [backend ...]
  backend: hb, sok or plain (the TensorFlow baseline); "hb+export" also exports a SavedModel.
"""

import json
import os
import sys

import numpy as np

from collective import context
from modelzoo import deepfm, dlrm, movielens, runner

out_dir, criteo_dir, movielens_dir, backends = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
COMMON = ["--batch_size", "32", "--steps", "8", "--log_every", "0", "--shuffle_buffer", "0", "--seed", "3"]
MODELS = {
    "dlrm": (dlrm.RECIPE, ["--data", criteo_dir, "--embedding_dim", "4", "--bottom_mlp", "8,4", "--top_mlp", "8,1",
                           "--learning_rate", "0.1"]),
    "deepfm": (deepfm.RECIPE, ["--data", criteo_dir, "--embedding_dim", "4", "--dnn", "8", "--learning_rate", "0.1"]),
    "movielens": (movielens.RECIPE, ["--data", movielens_dir, "--embedding_dim", "4", "--learning_rate", "0.05"]),
}
n = context.get().world_size
for token in backends:
    backend, export = token.split("+")[0], token.endswith("+export")
    for name, (recipe, flags) in MODELS.items():
        model_dir = os.path.join(out_dir, f"{name}-{backend}-n{n}")
        backend_flags = ["--plain"] if backend == "plain" else ["--backend", backend]
        export_flags = [] if export else ["--export_dir", "none"]
        args = runner.parse(recipe, COMMON + flags + backend_flags + export_flags + ["--model_dir", model_dir])
        metrics = runner.run(recipe, args, keep_predictions=True)
        predictions = metrics.pop("_predictions")
        if context.get().rank == 0:
            np.savez(model_dir + ".npz", **predictions)
            with open(model_dir + ".json", "w") as f:
                json.dump(metrics, f)
