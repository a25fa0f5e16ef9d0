"""The main job (``make demo``): DLRM on synthetic data on 2 workers with each backend.

For each exchange backend (``hb``, ``sok``) it trains the model zoo's DLRM
(``modelzoo/dlrm/train.py``) under ``collective.launch``, evaluates it on
held-out rows, exports a SavedModel, then serves that SavedModel with plain
TensorFlow in this process and prints a table: test AUC and log loss,
training samples/s, bytes each worker sent per sample, the AUC of the
served model, and the teacher's AUC (the best any model can reach on this
synthetic data).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

logger = logging.getLogger("collective.demo")
BACKENDS = ("hb", "sok")


def _train(workers: int, backend: str, model_dir: str, flags: List[str]) -> Dict[str, object]:
    import modelzoo  # pylint: disable=import-outside-toplevel  (only its __init__: no TensorFlow here)

    script = str(Path(modelzoo.__file__).resolve().parent / "dlrm" / "train.py")
    cmd = [sys.executable, "-m", "collective.launch", "-n", str(workers), script, "--backend", backend,
           "--model_dir", model_dir, *flags]
    logger.info("running %s", " ".join(cmd))
    code = subprocess.call(cmd)
    if code != 0:
        raise SystemExit(f"DLRM with backend {backend} on {workers} workers failed (exit code {code}); "
                         "see the worker output above")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        return json.load(f)


def _served_auc(export_path: str, test_files: Sequence[str], rows: int) -> float:
    """AUC of the exported SavedModel, served by plain TensorFlow, on the first ``rows`` test rows."""
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from modelzoo.heads import exact_auc  # pylint: disable=import-outside-toplevel

    table = pq.read_table(list(test_files)).slice(0, rows)
    serve = tf.saved_model.load(export_path).signatures["serving_default"]
    inputs = {name: tf.constant(table.column(name).to_numpy().astype(spec.dtype.as_numpy_dtype))
              for name, spec in serve.structured_input_signature[1].items()}
    return exact_auc(table.column("label").to_numpy(), serve(**inputs)["probabilities"].numpy())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collective.demo", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes per run")
    parser.add_argument("--steps", type=int, default=300, help="training steps per backend")
    parser.add_argument("--batch_size", type=int, default=1024, help="global batch size")
    parser.add_argument("--rows", type=int, default=262_144, help="synthetic training rows")
    parser.add_argument("--eval_rows", type=int, default=65_536, help="synthetic test rows")
    parser.add_argument("--out", default=None, help="directory for model dirs and exports (default: a new temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out or tempfile.mkdtemp(prefix="collective-demo-")
    flags = ["--steps", str(args.steps), "--batch_size", str(args.batch_size), "--rows", str(args.rows),
             "--eval_rows", str(args.eval_rows), "--log_every", "50"]
    results = {b: _train(args.workers, b, os.path.join(out, f"dlrm-{b}"), flags) for b in BACKENDS}

    from modelzoo import data as data_lib  # pylint: disable=import-outside-toplevel

    dataset = data_lib.synthetic(None, args.rows, args.eval_rows, 0.01, 0, 8192, rank=0)
    teacher = data_lib.teacher_auc(dataset)
    served = {b: _served_auc(r["export_path"], dataset.test, args.eval_rows) for b, r in results.items()}

    print(f"\nDLRM on {args.workers} workers, {args.steps} steps of {args.batch_size} "
          f"({dataset.description}); teacher AUC {teacher:.4f}")
    print(f"{'backend':<8} {'AUC':>7} {'loss':>7} {'samples/s':>10} {'bytes/sample':>13} {'served AUC':>11}  export")
    for b, r in results.items():
        print(f"{b:<8} {r['auc']:>7.4f} {r['loss']:>7.4f} {r['samples_per_sec']:>10,.0f} "
              f"{r['bytes_per_sample']:>13,.0f} {served[b]:>11.4f}  {r['export_path']}")
    gap = abs(results["hb"]["auc"] - results["sok"]["auc"])
    print(f"\nhb and sok train the same model from the same seed; their AUCs differ by {gap:.1e} "
          "(float summation order, compounded over the steps).")
    print(f"metrics.json and the SavedModels are under {out}")
    return 0 if all(np.isfinite(r["auc"]) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
