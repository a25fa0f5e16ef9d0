"""The main job (``make demo``): DLRM on synthetic data, plain TensorFlow and each backend on 2 workers.

It trains the model zoo's DLRM (``modelzoo/dlrm/train.py``) three times: in
one process of plain TensorFlow (``--plain``, the baseline), then under
``collective.launch`` with each exchange backend (``hb``, ``sok``, on the
same batches). Each run evaluates on held-out rows; the backends export a
SavedModel, which this process serves with plain TensorFlow. It prints a
table: test AUC and log loss, training samples/s, bytes each worker sent per
sample, the AUC of the served model, and the teacher's AUC (the best any
model can reach on this synthetic data); then writes three plots to
``--report_dir`` (the training loss per step of the three runs, samples/s,
bytes/sample) and prints their paths last. TensorFlow's info and warning
lines are off unless ``--verbose``.
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

from collective.runtime import logs
from collective.runtime.preload import WORKER_MODULES
from collective.demo import figures

logger = logging.getLogger("collective.demo")
BACKENDS = ("hb", "sok")
RUNS = ("plain",) + BACKENDS


def _train(workers: int, run: str, model_dir: str, flags: List[str]) -> Dict[str, object]:
    """Trains DLRM as ``run`` says (``plain``: one process without the launcher; a backend: ``workers``
    workers under it) and returns its ``metrics.json``."""
    import modelzoo  # pylint: disable=import-outside-toplevel  (only its __init__: no TensorFlow here)

    script = str(Path(modelzoo.__file__).resolve().parent / "dlrm" / "train.py")
    if run == "plain":  # the baseline needs no SavedModel: the backends' exports are what gets served
        cmd, where = [sys.executable, script, "--plain", "--export_dir", "none"], "in one process"
    else:
        cmd = [sys.executable, "-m", "collective.launch", "-n", str(workers), "--preload", WORKER_MODULES, script,
               "--backend", run]
        where = f"on {workers} workers"
    cmd += ["--model_dir", model_dir, *flags]
    logger.info("running %s", " ".join(cmd))
    code = subprocess.call(cmd)
    if code != 0:
        raise SystemExit(f"DLRM {run} {where} failed (exit code {code}); see its output above")
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
    return exact_auc(table.column("label").to_numpy(), serve(**inputs)["logistic"].numpy()[:, 0])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collective.demo", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes per backend")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--batch_size", type=int, default=1024, help="global batch size")
    parser.add_argument("--rows", type=int, default=262_144, help="synthetic training rows")
    parser.add_argument("--eval_rows", type=int, default=65_536, help="synthetic test rows")
    parser.add_argument("--log_every", type=int, default=50,
                        help="a progress line every this many steps (off a terminal: under the launcher)")
    parser.add_argument("--out", default=None, help="directory for model dirs and exports (default: a new temp dir)")
    parser.add_argument("--report_dir", default=os.path.join("reports", "demo"),
                        help="where the plots go (relative to the current directory)")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's and absl's info and warning lines (hidden by default)")
    args = parser.parse_args(argv)
    logs.configure(args.verbose)  # before TensorFlow loads, here and in the runs (they inherit the environment)
    out = args.out or tempfile.mkdtemp(prefix="collective-demo-")
    # Row groups of one worker's batch, read round-robin: step s of the workers reads the rows plain
    # TensorFlow reads at step s, so the three runs train on the same batches.
    row_group = args.batch_size // args.workers
    flags = ["--steps", str(args.steps), "--batch_size", str(args.batch_size), "--rows", str(args.rows),
             "--eval_rows", str(args.eval_rows), "--log_every", str(args.log_every), "--row_group_size", str(row_group)]
    flags += ["--verbose"] if args.verbose else []
    results = {r: _train(args.workers, r, os.path.join(out, f"dlrm-{r}"), flags) for r in RUNS}

    from modelzoo import data as data_lib  # pylint: disable=import-outside-toplevel

    dataset = data_lib.synthetic(None, args.rows, args.eval_rows, 0.01, 0, row_group, rank=0)
    teacher = data_lib.teacher_auc(dataset)
    served = {b: _served_auc(results[b]["export_path"], dataset.test, args.eval_rows) for b in BACKENDS}
    pictures = figures.write(results, args.report_dir)

    aucs = [r["auc"] for r in results.values()]
    gap = abs(results["hb"]["auc"] - results["sok"]["auc"])
    print(f"\nDLRM, {args.steps} steps of {args.batch_size} ({dataset.description}); teacher AUC {teacher:.4f}")
    print(f"plain TensorFlow, hb and sok train the same model from the same seed on the same batches; hb's and "
          f"sok's AUCs differ by {gap:.1e} (float summation order, compounded over the steps).")
    print(f"metrics.json and the SavedModels are under {out}\n")
    print(f"{'run':<6} {'workers':>7} {'AUC':>7} {'loss':>7} {'samples/s':>10} {'bytes/sample':>13} "
          f"{'served AUC':>11}  export")
    for name, r in results.items():
        served_auc = f"{served[name]:>11.4f}" if name in served else f"{'-':>11}"
        print(f"{name:<6} {r['workers']:>7} {r['auc']:>7.4f} {r['loss']:>7.4f} {r['samples_per_sec']:>10,.0f} "
              f"{r['bytes_per_sample']:>13,.0f} {served_auc}  {r['export_path'] or '-'}")
    print(f"\nplots in {args.report_dir}:")
    for path in pictures:
        print(f"  {path}")
    return 0 if all(np.isfinite(aucs)) else 1


if __name__ == "__main__":
    sys.exit(main())
