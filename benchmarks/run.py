"""The benchmark harness: ``python -m benchmarks.run --config <name>``.

Writes the configuration's Criteo-shaped synthetic Parquet data once, then
runs every configuration of ``benchmarks/configs/<name>.json`` (model x
mode x worker count x global batch) end to end through the real launcher
(``python -m collective.launch -n N -m benchmarks.worker``): each worker reads
its share of the Parquet files, warm-up steps excluded, several repeats. One
JSON record per run goes to ``reports/<name>/records/``, the communication
projection to ``reports/<name>/projection.json``, then the report
(``reports/<name>/REPORT.md``, see :mod:`benchmarks.report`).

Batch sizes are global: N workers each read ``global_batch // N`` rows a step.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from benchmarks import config as configs
from benchmarks import machine, projection
from benchmarks.launching import ROOT, launch_command, worker_env
from benchmarks.tables import table_sizes
from collective.byte_model import bytes_per_sample
from collective.cli import add_flag

logger = logging.getLogger("benchmarks.run")
REPORTS = os.path.join(ROOT, "reports")
RECORD_SCHEMA = 1


def run_id(spec: Dict[str, Any]) -> str:
    """A file-name-safe id of one run."""
    return f"{spec['model']}-{spec['mode']}-n{spec['workers']}-B{spec['global_batch']}"


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def write_data(config: Dict[str, Any], out_dir: str) -> str:
    """The configuration's Parquet data in ``out_dir``: ``train_batches`` of the largest global batch.

    Row groups of a quarter of a per-worker batch at the largest worker count,
    so that every worker count shards by whole row groups with equal shares.
    """
    from datasets.synthetic import generate  # pylint: disable=import-outside-toplevel

    batch = max(config["global_batch"])
    rows = int(config["train_batches"]) * batch
    group = max(1, batch // (4 * max(configs.worker_counts(config))))
    generate(out_dir, rows, files=1, scale=float(config["scale"]), seed=int(config["seed"]), row_group_size=group,
             progress=False)
    return out_dir


def worker_steps(data_dir: str, n: int, b: int, steps: int) -> List[Dict[int, Dict[str, np.ndarray]]]:
    """What each worker's input pipeline yields at each of ``steps`` steps (numpy, the reader's own plan)."""
    import collective.data as cd  # pylint: disable=import-outside-toplevel
    from datasets import schema  # pylint: disable=import-outside-toplevel

    out: List[Dict[int, Dict[str, np.ndarray]]] = [dict() for _ in range(steps)]
    for r in range(n):
        pieces, _ = cd.plan(data_dir, list(schema.CATEGORICAL), rank=r, world_size=n)
        batches = cd.iterate_batches(pieces, list(schema.CATEGORICAL), b, num_epochs=None, drop_remainder=True)
        for k, batch in zip(range(steps), batches):
            out[k][r] = batch
    return out


# The projection's name of each mode whose exchange it models.
_PROJECTED = {"hb": "hb", "hb_packed": "hb", "sok": "sok", "hvd_dp": "hvd_replicated", "hvd_dp_tuned": "hvd_replicated"}


def step_bytes(spec: Dict[str, Any], data_dir: str, dense_param_bytes: List[int]) -> Tuple[Optional[float], float]:
    """(projected bytes per step, dedup lower bound per step), all workers, averaged over the batches the
    workers read in the timed steps. The projection is None where it has no model of the mode (the
    single-process baselines, ``replicated``)."""
    n, b = spec["workers"], int(spec["global_batch"]) // spec["workers"]
    backend = None if spec["model"] in configs.TABLES_OUTSIDE_SCOPE else _PROJECTED.get(spec["mode"])
    if n == 1:
        return (0.0 if backend else None), 0.0
    from datasets import schema  # pylint: disable=import-outside-toplevel

    start, timed = spec["warmup"], spec["repeats"] * spec["steps"]
    at, vocabs, dims, groups = projection.model_tables(spec["model"], table_sizes(spec), spec["dim"])
    projected, bounds = [], []
    for step in worker_steps(data_dir, n, b, start + timed)[start:]:
        ids = [np.concatenate([step[r][schema.CATEGORICAL[i]] for r in range(n)]) for i in at]
        tables = [projection.sampled_traffic(t, v, d, g, n, b) for t, v, d, g in zip(ids, vocabs, dims, groups)]
        bounds.append(projection.lower_bound_bytes(tables, n, dense_param_bytes))
        if backend:
            projected.append(projection.step_bytes(ids, vocabs, dims, n, b, backend, dense_param_bytes, groups).total)
    return (float(np.mean(projected)) if backend else None), float(np.mean(bounds))


def summarise(spec: Dict[str, Any], ranks: List[Dict[str, Any]], data_dir: str, wall_s: float,
              host: Dict[str, Any], config_name: str) -> Dict[str, Any]:
    """The record of one run from its workers' results."""
    n = spec["workers"]
    b = ranks[0]["worker_batch"]
    repeats = len(ranks[0]["step_times"])
    # A synchronous step lasts as long as its slowest worker.
    step_times = [max(r["step_times"][rep][i] for r in ranks)
                  for rep in range(repeats) for i in range(len(ranks[0]["step_times"][rep]))]
    totals = [n * b * len(ranks[0]["step_times"][rep]) / max(sum(r["step_times"][rep]) for r in ranks)
              for rep in range(repeats)]
    bytes_per_worker = [r["bytes_per_step"] for r in ranks]
    bytes_per_step = float(sum(bytes_per_worker))
    last = max(1, len(ranks[0]["losses"]) // repeats)
    projected, bound = step_bytes(spec, data_dir, ranks[0]["dense_param_bytes"])
    return {
        "schema": RECORD_SCHEMA,
        "config": config_name,
        "run_id": run_id(spec),
        "model": spec["model"],
        "mode": spec["mode"],
        "kind": "backend" if spec["mode"] in configs.BACKENDS else "baseline",
        "workers": n,
        "global_batch": n * b,
        "worker_batch": b,
        "spec": spec,
        "machine": host,
        "samples_per_s": {"total_median": statistics.median(totals), "total_min": min(totals),
                          "total_max": max(totals), "per_worker_median": statistics.median(totals) / n,
                          "repeats": totals},
        "step_time_s": {"p50": _percentile(step_times, 50), "p90": _percentile(step_times, 90),
                        "all": step_times},
        "bytes_per_step": bytes_per_step,
        "bytes_per_worker_step": bytes_per_worker,
        "bytes_per_sample": bytes_per_sample(bytes_per_step, n * b),
        "projected_bytes_per_step": projected,
        "lower_bound_bytes_per_step": bound,
        "dense_param_bytes": ranks[0]["dense_param_bytes"],
        "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
        "embedding_bytes": [r["embedding_bytes"] for r in ranks],
        "packing_groups": ranks[0].get("packing_groups", 0),  # group variables of packed tables (hb_packed)
        # ops per step that read a whole table, per worker, in the graphs TensorFlow ran (after Grappler)
        "whole_table_reads": [r.get("whole_table_reads") for r in ranks],
        # the training loss over the last repeat's steps, averaged over workers (each on its own rows)
        "loss": float(np.mean([np.mean(r["losses"][-last:]) for r in ranks])),
        "wall_s": wall_s,
        "status": "ok",
        **({"trace": [r["trace"] for r in ranks]} if "trace" in ranks[0] else {}),
    }


def _failed(spec: Dict[str, Any], host: Dict[str, Any], config_name: str, wall: float, error: str) -> Dict[str, Any]:
    return {"schema": RECORD_SCHEMA, "config": config_name, "run_id": run_id(spec), "model": spec["model"],
            "mode": spec["mode"], "kind": "backend" if spec["mode"] in configs.BACKENDS else "baseline",
            "workers": spec["workers"], "global_batch": spec["global_batch"], "spec": spec, "machine": host,
            "wall_s": wall, "status": "failed", "error": error}


def run_launch(specs: List[Dict[str, Any]], data_dir: str, host: Dict[str, Any], config_name: str,
               timeout: float, preload: bool = False) -> List[Dict[str, Any]]:
    """Runs ``specs`` (all on the same number of workers) in one launch, its workers forked with ``preload``; one
    record each (``failed`` on error)."""
    n = specs[0]["workers"]
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec_path = os.path.join(tmp, "specs.json")
        with open(spec_path, "w") as f:
            json.dump(specs, f)
        cmd = launch_command(n, "benchmarks.worker", spec_path, data_dir, tmp, preload=preload)
        env = worker_env()
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * len(specs), env=env,
                                  cwd=ROOT)
            failure = None if proc.returncode == 0 else f"exit code {proc.returncode}\n{proc.stderr[-4000:]}"
        except subprocess.TimeoutExpired:
            failure = f"timed out after {timeout * len(specs):.0f} s"
        wall = (time.perf_counter() - start) / len(specs)
        records = []
        for i, spec in enumerate(specs):
            out = os.path.join(tmp, str(i))
            if not all(os.path.isfile(os.path.join(out, f"rank{r}.json")) for r in range(n)):
                records.append(_failed(spec, host, config_name, wall, failure or "no results written"))
                continue
            ranks = []
            for r in range(n):
                with open(os.path.join(out, f"rank{r}.json")) as f:
                    ranks.append(json.load(f))
            record = summarise(spec, ranks, data_dir, wall, host, config_name)
            record["shared_launch"] = len(specs) > 1
            records.append(record)
    return records


def launches(specs: List[Dict[str, Any]], share: bool) -> List[List[Dict[str, Any]]]:
    """The launches to make: one per run, or with ``share`` one per worker count."""
    if not share:
        return [[spec] for spec in specs]
    by_workers: Dict[int, List[Dict[str, Any]]] = {}
    for spec in specs:
        by_workers.setdefault(spec["workers"], []).append(spec)
    return list(by_workers.values())


def launch_all(groups: List[List[Dict[str, Any]]], data_dir: str, host: Dict[str, Any],
               config: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The records of every launch in ``groups``: one launch after another, or with the configuration's
    ``parallel_launches`` all at once (each launch's records as it ends)."""
    def one(group: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        return run_launch(group, data_dir, host, config["name"], config["timeout_s"], config["preload"])

    if not config["parallel_launches"] or len(groups) < 2:
        for group in groups:
            yield from one(group)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(groups)) as pool:
        for future in concurrent.futures.as_completed([pool.submit(one, group) for group in groups]):
            yield from future.result()


def progress_line(i: int, total: int, record: Dict[str, Any]) -> str:
    """One line per finished run."""
    head = f"[{i}/{total}] {record['model']:<9} {record['mode']:<10} N={record['workers']} B={record['global_batch']}"
    if record["status"] != "ok":
        return f"{head}: FAILED ({record['error'].splitlines()[0]}) after {record['wall_s']:.0f} s"
    s = record["samples_per_s"]
    return (f"{head}: {s['total_median']:>10,.0f} samples/s ({s['total_min']:,.0f}..{s['total_max']:,.0f}), "
            f"{record['bytes_per_sample']:8.1f} B/sample, loss {record['loss']:.4f} "
            f"({record['wall_s']:.0f} s)")


def run_projection(config: Dict[str, Any], out_dir: str) -> str:
    """Writes ``projection.json``: bytes and time per step at Criteo's real table sizes to N = ``max_workers``
    (:mod:`benchmarks.real_projection`), and the reader's rows/s on one core when the config asks; returns its path."""
    from benchmarks import real_projection  # pylint: disable=import-outside-toplevel

    p = config["projection"]
    counts = [n for n in projection.WORKER_COUNTS if n <= p["max_workers"]]
    out: Dict[str, Any] = {"fabrics": [vars(fab) for fab in projection.FABRICS],
                           "real_rows": real_projection.projection_rows(dim=config["dim"], batch_size=p["batch_size"],
                                                                        worker_counts=counts)}
    if config["reader"]:
        from benchmarks import data  # pylint: disable=import-outside-toplevel

        print("reader: rows/s on one core ...", flush=True)
        out["reader"] = data.measure_pinned(**config["reader"]) if isinstance(config["reader"], dict) \
            else data.measure_pinned()
    path = os.path.join(out_dir, "projection.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a name under benchmarks/configs (e.g. quick) or a JSON file")
    parser.add_argument("--out", default=None, help="output directory (default reports/<name>)")
    add_flag(parser, "--no_report", action="store_true", help="write records only")
    parser.add_argument("--note", default=None, help="a note for the top of the report (e.g. 'shared, noisy machine')")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = configs.load(args.config)
    except configs.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out_dir = args.out or os.path.join(REPORTS, config["name"])
    records_dir = os.path.join(out_dir, "records")
    os.makedirs(records_dir, exist_ok=True)
    for stale in os.listdir(records_dir):
        if stale.endswith(".json"):
            os.remove(os.path.join(records_dir, stale))
    host = machine.describe()
    if args.note is not None:
        config["note"] = args.note
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    specs = configs.matrix(config)
    print(f"benchmark {config['name']}: {len(specs)} runs on {host['cpu_model']} ({host['usable_cores']} cores, "
          f"load {host['load_average']}), records in {records_dir}", flush=True)
    started = time.perf_counter()
    failed = done = 0
    with tempfile.TemporaryDirectory(prefix="bench-data-") as data_dir:
        write_data(config, data_dir)
        for record in launch_all(launches(specs, config["share_launch"]), data_dir, host, config):
            done += 1
            failed += record["status"] != "ok"
            with open(os.path.join(records_dir, record["run_id"] + ".json"), "w") as f:
                json.dump(record, f, indent=1)
            print(progress_line(done, len(specs), record), flush=True)
    print(f"projection: N = 1 .. {config['projection']['max_workers']} ...", flush=True)
    print(f"wrote {run_projection(config, out_dir)}", flush=True)
    print(f"{len(specs)} runs in {time.perf_counter() - started:.0f} s, {failed} failed", flush=True)
    if not args.no_report:
        from benchmarks import report  # pylint: disable=import-outside-toplevel

        path = report.build(out_dir)
        print(f"report: {path}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
