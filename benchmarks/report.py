"""JSON records -> ``reports/<name>/REPORT.md`` with tables and PNG plots.

    python -m benchmarks.report [--dir reports/quick] [--note "..."]

Reads ``<dir>/records/*.json`` (written by :mod:`benchmarks.run`) and
``<dir>/projection.json`` when present, and writes ``REPORT.md`` next to them
with ``throughput.png``, ``bytes.png``, ``memory.png``, ``metric.png`` and
``projected_time.png``. Ratios compare runs of the same report only.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import pandas as pd

from collective import plots
from collective.plots import COLORS

logger = logging.getLogger("benchmarks.report")

REQUIRED = ("schema", "run_id", "model", "mode", "workers", "batch_size", "status")
REQUIRED_OK = ("samples_per_s", "step_time_s", "bytes_per_sample", "peak_rss_bytes", "embedding_bytes", "metric",
               "machine")
MODE_ORDER = ["tf_single", "hvd_replicated", "hb", "sok"]


class RecordError(ValueError):
    """A record file that is missing, unreadable or incomplete; the message names the file."""


def load_records(directory: str) -> List[Dict[str, Any]]:
    """Every record under ``directory/records`` (or ``directory`` itself), checked."""
    records_dir = os.path.join(directory, "records")
    if not os.path.isdir(records_dir):
        records_dir = directory
    paths = sorted(glob.glob(os.path.join(records_dir, "*.json")))
    if not paths:
        raise RecordError(f"no records (*.json) in {records_dir}: run 'python -m benchmarks.run --config NAME' first")
    records = []
    for path in paths:
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise RecordError(f"record {path} cannot be read as JSON: {err}") from err
        if not isinstance(record, dict):
            raise RecordError(f"record {path} is not a JSON object")
        missing = [k for k in REQUIRED if k not in record]
        if record.get("status") == "ok":
            missing += [k for k in REQUIRED_OK if k not in record]
        if missing:
            raise RecordError(f"record {path} lacks {', '.join(missing)}; regenerate it with benchmarks.run")
        record["_path"] = path
        records.append(record)
    return records


def frame(records: Sequence[Dict[str, Any]]) -> pd.DataFrame:
    """One row per successful run with the columns the tables and plots use."""
    rows = []
    for r in records:
        if r["status"] != "ok":
            continue
        rows.append({
            "model": r["model"], "mode": r["mode"], "workers": r["workers"], "batch": r["batch_size"],
            "samples/s": r["samples_per_s"]["total_median"], "min": r["samples_per_s"]["total_min"],
            "max": r["samples_per_s"]["total_max"], "per worker": r["samples_per_s"]["per_worker_median"],
            "step p50 ms": r["step_time_s"]["p50"] * 1e3, "step p90 ms": r["step_time_s"]["p90"] * 1e3,
            "B/sample": r["bytes_per_sample"],
            "projected B/sample": (None if r.get("projected_bytes_per_step") is None
                                   else r["projected_bytes_per_step"] / (r["workers"] * r["batch_size"])),
            "peak RSS MiB": max(r["peak_rss_bytes"]) / 2**20,
            "embedding MiB/worker": max(r["embedding_bytes"]) / 2**20,
            "AUC": r["metric"]["auc"], "logloss": r["metric"]["logloss"],
        })
    df = pd.DataFrame(rows)
    if not df.empty:
        df["mode"] = pd.Categorical(df["mode"], [m for m in MODE_ORDER if m in set(df["mode"])] +
                                    sorted(set(df["mode"]) - set(MODE_ORDER)))
        df = df.sort_values(["model", "batch", "workers", "mode"]).reset_index(drop=True)
    return df


def parity(df: pd.DataFrame) -> pd.DataFrame:
    """AUC and log loss per run with the AUC difference to tf_single of the same model and batch size."""
    out = df[["model", "mode", "workers", "batch", "AUC", "logloss"]].copy()
    single = df[df["mode"] == "tf_single"].set_index(["model", "batch"])["AUC"]
    out["AUC - tf_single"] = [row["AUC"] - single.get((row["model"], row["batch"]), math.nan)
                              for _, row in df.iterrows()]
    return out


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """hb and sok samples/s over tf_single (one process) and over hvd_replicated at the same N."""
    rows = []
    for (model, batch), group in df.groupby(["model", "batch"], observed=True):
        single = group[group["mode"] == "tf_single"]["samples/s"]
        for _, row in group[group["mode"].isin(["hb", "sok"])].iterrows():
            hvd = group[(group["mode"] == "hvd_replicated") & (group["workers"] == row["workers"])]["samples/s"]
            rows.append({"model": model, "batch": batch, "workers": row["workers"], "backend": row["mode"],
                         "samples/s": row["samples/s"],
                         "/ tf_single": row["samples/s"] / single.iloc[0] if len(single) else math.nan,
                         "/ hvd_replicated": row["samples/s"] / hvd.iloc[0] if len(hvd) else math.nan})
    return pd.DataFrame(rows)


def _cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else format(value, floatfmt)
    return "n/a" if value is None else str(value)


def _markdown(df: pd.DataFrame, floatfmt: str = ",.2f") -> str:
    """``df`` as a GitHub Markdown table (pandas' to_markdown needs tabulate, which is not installed)."""
    if df.empty:
        return "_(no rows)_\n"
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v, floatfmt) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _plot_throughput(df: pd.DataFrame, path: str) -> None:
    plt = plots.pyplot()
    groups = list(df.groupby(["model", "batch"], observed=True))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, ((model, batch), group) in zip(axes[0], groups):
        workers = sorted(group["workers"].unique())
        modes = [m for m in group["mode"].cat.categories if m in set(group["mode"])]
        width = 0.8 / max(len(modes), 1)
        for i, mode in enumerate(modes):
            sub = group[group["mode"] == mode].set_index("workers")
            xs = [j + i * width for j, n in enumerate(workers) if n in sub.index]
            ys = [sub.loc[n, "samples/s"] for n in workers if n in sub.index]
            err = [[sub.loc[n, "samples/s"] - sub.loc[n, "min"] for n in workers if n in sub.index],
                   [sub.loc[n, "max"] - sub.loc[n, "samples/s"] for n in workers if n in sub.index]]
            ax.bar(xs, ys, width, yerr=err, label=mode, color=COLORS.get(mode))
        ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(workers))])
        ax.set_xticklabels([f"N={n}" for n in workers])
        ax.set_ylabel("samples/s (all workers, median, min..max)")
        ax.set_title(f"{model}, batch {batch} per worker")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_bytes(df: pd.DataFrame, proj: Optional[pd.DataFrame], path: str) -> None:
    plt = plots.pyplot()
    datasets = [] if proj is None else list(proj["dataset"].unique())
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(6.5 * max(len(datasets), 1), 4.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets or [None]):
        if dataset is not None:
            for backend, sub in proj[(proj["dataset"] == dataset) & (proj["workers"] > 1)].groupby("backend"):
                ax.plot(sub["workers"], sub["bytes_per_sample"], "-", color=COLORS.get(backend),
                        label=f"{backend} projected (b={sub['batch_size'].iloc[0]})")
        if dataset is None or dataset.startswith("synthetic"):
            for mode, sub in df[df["workers"] > 1].groupby("mode", observed=True):
                ax.plot(sub["workers"], sub["B/sample"], "o", color=COLORS.get(mode), label=f"{mode} measured")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers N")
        ax.set_ylabel("bytes sent per sample (all workers)")
        ax.set_title(dataset or "measured")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_time(proj: pd.DataFrame, fabrics: List[str], path: str) -> None:
    plt = plots.pyplot()
    synthetic = proj[proj["dataset"].str.startswith("synthetic") & (proj["workers"] > 1)]
    fig, axes = plt.subplots(1, len(fabrics), figsize=(6.5 * len(fabrics), 4.5), squeeze=False)
    for ax, fabric in zip(axes[0], fabrics):
        for backend, sub in synthetic.groupby("backend"):
            ax.plot(sub["workers"], sub[f"seconds[{fabric}]"] * 1e3, "-o", ms=3, color=COLORS.get(backend),
                    label=backend)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers N")
        ax.set_ylabel("projected communication ms/step")
        ax.set_title(fabric, fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_bars(df: pd.DataFrame, column: str, ylabel: str, path: str) -> None:
    labels = [f"{r['mode']}\nN={r['workers']} b={r['batch']}" for _, r in df.iterrows()]
    ylim = (max(0.0, df[column].min() - 0.05), min(1.0, df[column].max() + 0.02)) if column == "AUC" else None
    plots.bar_chart(labels, list(df[column]), path, ylabel=ylabel,
                    colors=[COLORS.get(m, plots.OTHER_COLOR) for m in df["mode"]], ylim=ylim)


def _machine_lines(records: Sequence[Dict[str, Any]]) -> List[str]:
    host = records[0]["machine"]
    libs = ", ".join(f"{k} {v}" for k, v in host.get("libraries", {}).items())
    return [f"- CPU: {host.get('cpu_model')} ({host.get('cores')} cores, {host.get('usable_cores')} usable)",
            f"- GPU: {', '.join(host.get('gpus') or []) or 'none'}",
            f"- load average at start: {host.get('load_average')}",
            f"- Python {host.get('python')}; {libs}; collective {host.get('collective_commit')}"]


def build(directory: str, note: str = "") -> str:
    """Writes ``directory/REPORT.md`` and its plots from the records there; returns the report's path."""
    records = load_records(directory)
    df = frame(records)
    failed = [r for r in records if r["status"] != "ok"]
    proj_path = os.path.join(directory, "projection.json")
    proj, fabrics = None, []
    if os.path.isfile(proj_path):
        try:
            with open(proj_path) as f:
                loaded = json.load(f)
            proj = pd.DataFrame(loaded["rows"])
            fabrics = [fab["name"] for fab in loaded["fabrics"]]
        except (OSError, json.JSONDecodeError, KeyError) as err:
            raise RecordError(f"projection {proj_path} cannot be read: {err}") from err
    config_path = os.path.join(directory, "config.json")
    config = json.load(open(config_path)) if os.path.isfile(config_path) else {}
    name = config.get("name") or os.path.basename(os.path.normpath(directory))
    note = note or config.get("note", "")
    plots = []
    if not df.empty:
        _plot_throughput(df, os.path.join(directory, "throughput.png"))
        _plot_bars(df, "peak RSS MiB", "peak resident memory per worker (MiB)", os.path.join(directory, "memory.png"))
        _plot_bars(df, "AUC", "evaluation AUC after the run", os.path.join(directory, "metric.png"))
        plots += ["throughput.png", "memory.png", "metric.png"]
    _plot_bytes(df, proj, os.path.join(directory, "bytes.png"))
    plots.append("bytes.png")
    if proj is not None:
        _plot_time(proj, fabrics, os.path.join(directory, "projected_time.png"))
        plots.append("projected_time.png")

    lines = [f"# Benchmark report: {name}", ""]
    if config.get("description"):
        lines += [config["description"], ""]
    if note:
        lines += [f"**Note:** {note}", ""]
    lines += ["## Machine", ""] + _machine_lines(records) + [""]
    if config:
        lines += [f"Runs: models {config.get('models')}, workers {config.get('workers')}, batch sizes per worker "
                  f"{config.get('batch_sizes')}, {config.get('warmup')} warm-up steps (excluded), "
                  f"{config.get('steps')} timed steps x {config.get('repeats')} repeats, embedding dim "
                  f"{config.get('dim')}, synthetic table scale {config.get('scale')}, Adagrad lr "
                  f"{config.get('learning_rate')}. Every run goes through `python -m collective.launch`.", ""]
    lines += ["## Headline: samples/s relative to the baselines (same run)", "",
              "`/ tf_single`: total samples/s of the backend at N workers over one plain TensorFlow process "
              "with `embedding_column`s; `/ hvd_replicated`: over Horovod data parallelism with every table "
              "replicated at the same N.", "", _markdown(ratios(df) if not df.empty else df, ",.3f")]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- `{r['run_id']}`: {str(r.get('error', '')).splitlines()[0] if r.get('error') else 'failed'}"
                  for r in failed] + [""]
    lines += ["## Throughput and step time", "", "![throughput](throughput.png)", "",
              _markdown(df[["model", "mode", "workers", "batch", "samples/s", "min", "max", "per worker",
                            "step p50 ms", "step p90 ms"]] if not df.empty else df),
              "## Bytes on the wire", "",
              "Measured: `collective.comm`'s byte counter over the timed steps (for hvd_replicated the step adds "
              "what Horovod's allgather/allreduce send under the same byte model), summed over workers, per "
              "sample. Projected: :mod:`benchmarks.projection` on the same batches.", "",
              _markdown(df[["model", "mode", "workers", "batch", "B/sample", "projected B/sample"]]
                        if not df.empty else df),
              "![bytes](bytes.png)", ""]
    if proj is not None:
        picked = proj[proj["workers"].isin([8, 64, 1024])]
        table = picked.pivot_table(index=["dataset", "workers"], columns="backend", values="bytes_per_sample")
        lines += ["### Projected bytes per sample at 8, 64 and 1024 workers", "",
                  f"Per-worker batch {proj['batch_size'].iloc[0]}, embedding dim {proj['dim'].iloc[0]}; "
                  "global batch N x b drawn from the data (MovieLens rows with replacement). Under hb and sok a "
                  "table with fewer rows than workers stays replicated and its gradient is allgathered (MovieLens's "
                  "610 users at N = 1024).", "",
                  _markdown(table.reset_index(), ",.1f"), "",
                  "### Projected communication time per step", "",
                  "Model: `calls x latency x hops + busiest worker's bytes / bandwidth`, hops = N-1 for "
                  "alltoall, ceil(log2 N) for allgather/reduce-scatter/allreduce. Parameters: "
                  + "; ".join(fabrics) + ". NVLink figures only make sense up to one node (8 GPUs).", "",
                  "![projected time](projected_time.png)", ""]
    lines += ["## Memory per worker", "", "![memory](memory.png)", "",
              _markdown(df[["model", "mode", "workers", "batch", "peak RSS MiB", "embedding MiB/worker"]]
                        if not df.empty else df),
              "Embedding MiB/worker counts the tables and their Adagrad slots held by one worker.", "",
              "## Metric parity", "", "![metric](metric.png)", "",
              _markdown(parity(df) if not df.empty else df, ",.4f"),
              "AUC and log loss on the same held-out synthetic rows after the timed steps. Runs at the same N "
              "train the same global batches; different N train different global batch sizes.", ""]
    path = os.path.join(directory, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    logger.info("wrote %s with %s", path, ", ".join(plots))
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join("reports", "quick"), help="directory of a benchmark run")
    parser.add_argument("--note", default="", help="a note printed at the top of the report")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        print(build(args.dir, args.note))
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
