"""Step traces of chosen runs of a benchmark configuration: where each mode's step goes.

    python -m benchmarks.profile --config quick --runs dlrm:hb@1,dlrm:tf_mts_tuned@1 [--steps 5]

Each run is the configuration's run of that model, mode and worker count
(:func:`benchmarks.config.matrix`), started through the real launcher as
:mod:`benchmarks.run` starts it, with its first ``--steps`` timed steps
traced (:class:`benchmarks.tracing.StepTracer`). One JSON file per run goes to
``reports/<name>/profiles/`` (op milliseconds per step and type, per rank);
``python -m benchmarks.report`` shows them under "Where the step goes".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

from benchmarks import config as configs
from benchmarks import machine, run
from benchmarks.tracing import table_rows

PROFILES = "profiles"


def parse_runs(text: str) -> List[tuple]:
    """``model:mode@N,...`` as ``[(model, mode, N)]``; the error shows the expected form."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            model, rest = item.split(":")
            mode, n = rest.split("@")
            out.append((model, mode, int(n)))
        except ValueError as err:
            raise ValueError(f"--runs entry {item!r} is not model:mode@N (e.g. dlrm:hb@2)") from err
    return out


def specs_for(config: Dict[str, Any], wanted: Sequence[tuple], steps: int) -> List[Dict[str, Any]]:
    """The configuration's specs of ``wanted`` runs, each tracing ``steps`` steps once."""
    matrix = {(s["model"], s["mode"], s["workers"]): s for s in configs.matrix(config)}
    missing = [w for w in wanted if w not in matrix]
    if missing:
        known = ", ".join(f"{m}:{mode}@{n}" for m, mode, n in sorted(matrix))
        raise ValueError(f"configuration {config['name']} has no run {missing}; its runs: {known}")
    return [dict(matrix[w], trace_steps=steps, steps=steps, repeats=1) for w in wanted]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a name under benchmarks/configs or a JSON file")
    parser.add_argument("--runs", required=True, help="model:mode@N, comma-separated (e.g. dlrm:hb@1,dlrm:hb@2)")
    parser.add_argument("--steps", type=int, default=5, help="traced steps per run (default 5)")
    parser.add_argument("--out", default=None, help="report directory (default reports/<name>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = configs.load(args.config)
        specs = specs_for(config, parse_runs(args.runs), args.steps)
    except (configs.ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out_dir = os.path.join(args.out or os.path.join(run.REPORTS, config["name"]), PROFILES)
    os.makedirs(out_dir, exist_ok=True)
    host = machine.describe()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bench-data-") as data_dir:
        run.write_data(config, data_dir)
        for spec in specs:
            record = run.run_launch([spec], data_dir, host, config["name"], config["timeout_s"])[0]
            if record["status"] != "ok":
                failed += 1
                print(f"{run.run_id(spec)}: FAILED {record['error'].splitlines()[0]}", flush=True)
                continue
            profile = {"run_id": record["run_id"], "model": spec["model"], "mode": spec["mode"],
                       "workers": spec["workers"], "global_batch": spec["global_batch"], "machine": host,
                       "ranks": record["trace"]}
            with open(os.path.join(out_dir, record["run_id"] + ".json"), "w") as f:
                json.dump(profile, f, indent=1)
            top = ", ".join(f"{r['op type']} {r['ms/step']:.1f} ms ({r['share']:.0%})"
                            for r in table_rows(record["trace"][0], top=4)[:-1])
            print(f"{record['run_id']}: rank 0 step {record['trace'][0]['wall_ms']:.1f} ms traced; {top}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
