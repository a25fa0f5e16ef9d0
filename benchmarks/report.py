"""JSON records -> ``reports/<name>/REPORT.md`` with tables and PNG plots.

    python -m benchmarks.report [--dir reports/quick] [--note "..."]

Reads ``<dir>/records/*.json`` (written by :mod:`benchmarks.run`) and
``<dir>/projection.json`` when present, and writes ``REPORT.md`` next to them
with ``throughput.png``, ``step_times.png``, ``bytes.png``, ``memory.png`` and
the projection's plot. Ratios compare runs of the same report only.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd

from benchmarks import config as configs
from benchmarks.markdown import markdown_table
from collective.cli import plots
from collective.cli.plots import COLORS

logger = logging.getLogger("benchmarks.report")

REQUIRED = ("schema", "run_id", "model", "mode", "workers", "global_batch", "status")
REQUIRED_OK = ("samples_per_s", "step_time_s", "bytes_per_sample", "peak_rss_bytes", "embedding_bytes", "loss",
               "machine")
MODE_ORDER = ["estimator", "estimator_tuned", "tf_mts", "tf_mts_tuned", "hvd_dp", "hvd_dp_tuned", "hvd_dp_dense",
              "ceiling", "replicated", "hb", "hb_packed", "sok"]
HEADLINE_MODELS = ("dlrm", "deepfm")
# The report's section of each model below the headline: (title, one line).
OTHER_MODELS = {
    "embedding": ("The embedding-only step",
                  "The 26 tables and one linear layer: the step is the lookups and their exchange."),
    "dlrm_outside_scope": ("DLRM with its tables outside embedding_scope()",
                           "The program keeps its tables out of `embedding_scope()`: plain TensorFlow variables "
                           "under `scope()`, held whole on every worker, their gradients averaged like dense ones."),
}
BEST = "best baseline"  # the fastest baseline at the same N: one process at N = 1, Horovod DP beyond
# (label, numerator (mode, N), denominator (mode or BEST, N), target); a dict target maps "real" (scale 1, Criteo
# Kaggle's table sizes) and "small" (scale < 1) to their values.
TARGETS = [("hb@1 / best baseline@1", ("hb", 1), (BEST, 1), {"small": 1.0, "real": 1.2}),
           ("hb@1 / embedding-free ceiling@1", ("hb", 1), ("ceiling", 1), 0.9),
           ("hb@2 / best Horovod DP@2", ("hb", 2), (BEST, 2), 1.5),
           ("sok@2 / best Horovod DP@2", ("sok", 2), (BEST, 2), 1.2),
           # packing (issue 44), in the configurations that run hb_packed: a dict target keyed by model
           ("hb_packed@1 / hb@1", ("hb_packed", 1), ("hb", 1), 1.0),
           ("hb_packed@1 / embedding-free ceiling@1", ("hb_packed", 1), ("ceiling", 1), {"dlrm": 0.95, "deepfm": 0.85}),
           ("hb_packed@2 / embedding-free ceiling@2", ("hb_packed", 2), ("ceiling", 2), 0.5),
           ("hb_packed@2 / best Horovod DP@2", ("hb_packed", 2), (BEST, 2), 1.3)]
BYTES_TARGET = 1.1  # hb's bytes per sample over the dedup lower bound of the same batches
WHY_AS_SHIPPED = ("As shipped, TensorFlow's Grappler rewrites each feature column's sparse lookup of a plain "
                  "table into a read of the whole table, which Adagrad's update then copies: every step costs the "
                  "tables' size. The tuned baselines add the one line of session config that stops it "
                  "(`rewrite_options.arithmetic_optimization = OFF`); collective's sessions set it themselves.")


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
        held = max(r["embedding_bytes"])
        whole = held if r["mode"] in configs.BASELINES + ("replicated",) else sum(r["embedding_bytes"])
        bound = r.get("lower_bound_bytes_per_step")
        rows.append({
            "model": r["model"], "mode": r["mode"], "workers": r["workers"], "batch": r["global_batch"],
            "samples/s": r["samples_per_s"]["total_median"], "min": r["samples_per_s"]["total_min"],
            "max": r["samples_per_s"]["total_max"], "per worker": r["samples_per_s"]["per_worker_median"],
            "step p50 ms": r["step_time_s"]["p50"] * 1e3, "step p90 ms": r["step_time_s"]["p90"] * 1e3,
            "B/sample": r["bytes_per_sample"],
            "projected B/sample": (None if r.get("projected_bytes_per_step") is None
                                   else r["projected_bytes_per_step"] / r["global_batch"]),
            "lower bound B/sample": None if bound is None else bound / r["global_batch"],
            "peak RSS MiB": max(r["peak_rss_bytes"]) / 2**20,
            "tables MiB/worker": held / 2**20,
            "tables MiB total": whole / 2**20,
            "per worker / (total / N)": held / (whole / r["workers"]) if whole else math.nan,
            "loss": r["loss"],
            "whole-table reads": (math.nan if None in r.get("whole_table_reads", [None])
                                  else max(r["whole_table_reads"])),
            "scale": float(r.get("spec", {}).get("scale", math.nan)),
            "_steps": r["step_time_s"].get("all", []),
        })
    df = pd.DataFrame(rows)
    if not df.empty:
        df["mode"] = pd.Categorical(df["mode"], [m for m in MODE_ORDER if m in set(df["mode"])] +
                                    sorted(set(df["mode"]) - set(MODE_ORDER)))
        df = df.sort_values(["model", "batch", "workers", "mode"]).reset_index(drop=True)
    return df


def _rate(group: pd.DataFrame, mode: str, workers: int) -> float:
    hit = group[(group["mode"] == mode) & (group["workers"] == workers)]["samples/s"]
    return float(hit.iloc[0]) if len(hit) else math.nan


def best_baseline(group: pd.DataFrame, workers: int) -> Tuple[Optional[str], float]:
    """(mode, samples/s) of the fastest baseline at ``workers``: a one-process program at 1 (stock Estimator or
    plain TF, as shipped or tuned), Horovod data parallelism (any of its variants) beyond; (None, nan) if none ran."""
    candidates = configs.SINGLE_PROCESS if workers == 1 else configs.DATA_PARALLEL
    rates = [(_rate(group, mode, workers), mode) for mode in candidates]
    rates = [(rate, mode) for rate, mode in rates if not math.isnan(rate)]
    if not rates:
        return None, math.nan
    rate, mode = max(rates)
    return mode, rate


def as_shipped(group: pd.DataFrame, workers: int) -> float:
    """Samples/s of the baseline as shipped at ``workers``: the stock Estimator at 1, Horovod DP beyond."""
    return _rate(group, "estimator" if workers == 1 else "hvd_dp", workers)


def _denominator(group: pd.DataFrame, mode: str, workers: int) -> float:
    return best_baseline(group, workers)[1] if mode == BEST else _rate(group, mode, workers)


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Every run's samples/s with its spread over repeats, over the best baseline at its N (named), the baseline
    as shipped at its N and the embedding-free ceiling at its N."""
    rows = []
    for (model, batch), group in df.groupby(["model", "batch"], observed=True):
        for _, row in group.iterrows():
            n = row["workers"]
            best, rate = best_baseline(group, n)
            rows.append({"model": model, "global batch": batch, "mode": row["mode"], "workers": n,
                         "samples/s": row["samples/s"], "spread": f"{row['min']:,.0f}..{row['max']:,.0f}",
                         "/ best baseline@N": row["samples/s"] / rate, "best baseline@N": best or "n/a",
                         "/ as shipped@N": row["samples/s"] / as_shipped(group, n),
                         "/ ceiling@N": row["samples/s"] / _rate(group, configs.CEILING, n)})
    return pd.DataFrame(rows)


def _target_value(target: Any, scale: float, model: str) -> float:
    if isinstance(target, dict) and model in target:
        return target[model]
    if isinstance(target, dict):
        return target["real"] if scale >= 1.0 else target["small"]
    return float(target)


def targets(df: pd.DataFrame) -> pd.DataFrame:
    """The targets of the benchmark issue, per headline model: measured ratio, target, met."""
    rows = []
    for (model, batch), group in df.groupby(["model", "batch"], observed=True):
        if model not in HEADLINE_MODELS:
            continue
        scale = float(group["scale"].iloc[0])
        for label, (num, n), (den, m), target in TARGETS:
            if num in configs.PACKED_MODES and num not in set(group["mode"]):
                continue  # a configuration that does not run packing
            value = _rate(group, num, n) / _denominator(group, den, m)
            wanted = _target_value(target, scale, model)
            if den == BEST:
                label = f"{label} ({best_baseline(group, m)[0] or 'none ran'})"
            rows.append({"model": model, "global batch": batch, "figure": label, "measured": value,
                         "target": f">= {wanted}", "met": "n/a" if math.isnan(value) else
                         ("yes" if value >= wanted else "no")})
        hb2 = group[(group["mode"] == "hb") & (group["workers"] == 2)]
        bound = hb2["lower bound B/sample"].iloc[0] if len(hb2) else None
        value = hb2["B/sample"].iloc[0] / bound if bound else math.nan
        rows.append({"model": model, "global batch": batch, "figure": "hb@2 bytes/sample / dedup lower bound",
                     "measured": value, "target": f"<= {BYTES_TARGET}",
                     "met": "n/a" if math.isnan(value) else ("yes" if value <= BYTES_TARGET else "no")})
    return pd.DataFrame(rows)


def _cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else format(value, floatfmt)
    return "n/a" if value is None else str(value)


def _markdown(df: pd.DataFrame, floatfmt: str = ",.2f") -> str:
    """``df`` as a Markdown table, floats formatted with ``floatfmt``."""
    if df.empty:
        return "_(no rows)_\n"
    return markdown_table(list(df.columns), [[_cell(v, floatfmt) for v in row] for row in df.itertuples(index=False)])


def _panels(df: pd.DataFrame):
    groups = list(df.groupby(["model", "batch"], observed=True))
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.2), squeeze=False)
    return plt, fig, zip(axes[0], groups)


def _save(plt, fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _modes(group: pd.DataFrame) -> List[str]:
    return [m for m in group["mode"].cat.categories if m in set(group["mode"])]


def _plot_throughput(df: pd.DataFrame, path: str) -> None:
    plt, fig, panels = _panels(df)
    for ax, ((model, batch), group) in panels:
        workers = sorted(group["workers"].unique())
        modes = _modes(group)
        width = 0.8 / max(len(modes), 1)
        for i, mode in enumerate(modes):
            sub = group[group["mode"] == mode].set_index("workers")
            at = [n for n in workers if n in sub.index]
            ax.bar([workers.index(n) + i * width for n in at], [sub.loc[n, "samples/s"] for n in at], width,
                   yerr=[[sub.loc[n, "samples/s"] - sub.loc[n, "min"] for n in at],
                         [sub.loc[n, "max"] - sub.loc[n, "samples/s"] for n in at]],
                   label=mode, color=COLORS.get(mode))
        ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(workers))])
        ax.set_xticklabels([f"N={n}" for n in workers])
        ax.set_ylabel("samples/s (all workers; median, min..max)")
        ax.set_title(f"{model}, global batch {batch}")
        ax.legend(fontsize=7)
    _save(plt, fig, path)


def _plot_step_times(df: pd.DataFrame, path: str) -> None:
    plt, fig, panels = _panels(df)
    for ax, ((model, batch), group) in panels:
        labels = [f"{r['mode']}\nN={r['workers']}" for _, r in group.iterrows()]
        box = ax.boxplot([[t * 1e3 for t in r["_steps"]] or [math.nan] for _, r in group.iterrows()],
                         tick_labels=labels, patch_artist=True, showfliers=True)
        for patch, mode in zip(box["boxes"], group["mode"]):
            patch.set_facecolor(COLORS.get(mode, plots.OTHER_COLOR))
            patch.set_alpha(0.6)
        ax.set_ylabel("step time, ms (slowest worker)")
        ax.set_title(f"{model}, global batch {batch}")
        ax.tick_params(axis="x", labelsize=7)
    _save(plt, fig, path)


def _plot_vs_workers(df: pd.DataFrame, column: str, ylabel: str, path: str, log: bool = False) -> None:
    plt, fig, panels = _panels(df)
    for ax, ((model, batch), group) in panels:
        for mode in _modes(group):
            sub = group[group["mode"] == mode].sort_values("workers")
            ax.plot(sub["workers"], sub[column], "-o", color=COLORS.get(mode, plots.OTHER_COLOR), label=mode)
        ax.set_xlabel("workers N")
        ax.set_xticks(sorted(group["workers"].unique()))
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("symlog")
        ax.set_title(f"{model}, global batch {batch}")
        ax.legend(fontsize=7)
    _save(plt, fig, path)


def _machine_lines(records: Sequence[Dict[str, Any]]) -> List[str]:
    host = records[0]["machine"]
    libs = ", ".join(f"{k} {v}" for k, v in host.get("libraries", {}).items())
    return [f"- CPU: {host.get('cpu_model')} ({host.get('cores')} cores, {host.get('usable_cores')} usable)",
            f"- GPU: {', '.join(host.get('gpus') or []) or 'none'}",
            f"- load average at start: {host.get('load_average')}",
            f"- Python {host.get('python')}; {libs}; collective {host.get('collective_commit')}"]


def _load_projection(directory: str) -> Dict[str, Any]:
    path = os.path.join(directory, "projection.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise RecordError(f"projection {path} cannot be read: {err}") from err


def _run_line(config: Dict[str, Any]) -> str:
    modes = ", ".join(f"{m} at N={'/'.join(map(str, n))}" for m, n in config.get("modes", {}).items())
    return (f"Runs: models {config.get('models')}; {modes}; global batch {config.get('global_batch')} "
            f"(each of N workers reads global // N rows a step); {config.get('warmup')} warm-up steps (excluded), "
            f"{config.get('steps')} timed steps x {config.get('repeats')} repeats; embedding dim {config.get('dim')}, "
            f"synthetic Criteo tables at scale {config.get('scale')} ({config.get('api')}), MLPs bottom "
            f"{config.get('bottom_mlp')} + dim, top {config.get('top_mlp')} + 1, DeepFM DNN {config.get('dnn')}; "
            f"Adagrad lr {config.get('learning_rate')}. Every run reads the same Parquet files through "
            "`collective.data` and is started by `python -m collective.launch`.")


def load_profiles(directory: str) -> List[Dict[str, Any]]:
    """The step traces of ``python -m benchmarks.profile`` under ``directory/profiles``, in file order."""
    profiles = []
    for path in sorted(glob.glob(os.path.join(directory, "profiles", "*.json"))):
        try:
            with open(path) as f:
                profiles.append(json.load(f))
        except (OSError, json.JSONDecodeError) as err:
            raise RecordError(f"profile {path} cannot be read as JSON: {err}") from err
    return profiles


def profiles_section(directory: str, top: int = 10) -> List[str]:
    """"Where the step goes": op milliseconds per step by op type of each traced run (rank 0), side by side."""
    profiles = load_profiles(directory)
    if not profiles:
        return []
    from benchmarks.tracing import table_rows  # pylint: disable=import-outside-toplevel

    names = [f"{p['model']} {p['mode']}@{p['workers']}" for p in profiles]
    kinds: List[str] = []
    for p in profiles:
        kinds += [r["op type"] for r in table_rows(p["ranks"][0], top)[:-1] if r["op type"] not in kinds]
    rows = [[kind] + [p["ranks"][0]["op_ms"].get(kind, 0.0) for p in profiles] for kind in kinds]
    rows.append(["(all ops)"] + [sum(p["ranks"][0]["op_ms"].values()) for p in profiles])
    rows.append(["traced step wall ms"] + [p["ranks"][0]["wall_ms"] for p in profiles])
    table = markdown_table(["op type, ms per step (rank 0)"] + names,
                           [[row[0]] + [f"{v:,.1f}" for v in row[1:]] for row in rows])
    return ["## Where the step goes", "",
            "Op time by op type from `RunOptions(trace_level=FULL_TRACE)` step traces "
            "(`python -m benchmarks.profile`, rank 0, mean of the traced steps). Op time sums every op's own "
            "duration on all threads, so it can exceed the wall time; a collective's time includes waiting for "
            "the other workers; tracing slows the step, so compare shares.", "", table]


def overhead_section(directory: str, df: pd.DataFrame) -> List[str]:
    """"What collective adds per step": ``python -m benchmarks.overhead``'s medians beside hb's DLRM step."""
    path = os.path.join(directory, "overhead.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        measured = json.load(f)
    rows = []
    for row in measured["rows"]:
        hb = df[(df["model"] == "dlrm") & (df["mode"] == "hb") & (df["workers"] == row["workers"])] \
            if not df.empty else df
        step_ms = float(hb["step p50 ms"].iloc[0]) if len(hb) else math.nan
        rows.append([str(row["workers"]), row["variant"], f"{row['median_us']:,.0f}", f"{row['added_us']:+,.0f}",
                     "n/a" if math.isnan(step_ms) else f"{row['added_us'] / 1e3 / step_ms:.2%}"])
    return ["## What collective adds per step", "",
            f"`python -m benchmarks.overhead`: an empty step (one 16-float update) under `scope()`, median of "
            f"{measured['steps']} steps, bare and with each per-step cost the library can add (the heartbeat "
            "lines, the checkpoint/preemption flag's allreduce, the Estimator's loss allreduce, the progress "
            "line with its byte-counter allreduce every 100 steps); the last column sets the addition against "
            "hb's DLRM step (p50) at the same N in this report.", "",
            markdown_table(["workers", "added", "us/step", "added us/step", "of hb's DLRM step"], rows)]


def build(directory: str, note: str = "") -> str:
    """Writes ``directory/REPORT.md`` and its plots from the records there; returns the report's path."""
    records = load_records(directory)
    df = frame(records)
    failed = [r for r in records if r["status"] != "ok"]
    projected = _load_projection(directory)
    config_path = os.path.join(directory, "config.json")
    config = json.load(open(config_path)) if os.path.isfile(config_path) else {}
    name = config.get("name") or os.path.basename(os.path.normpath(directory))
    note = note or config.get("note", "")
    if not df.empty:
        _plot_throughput(df, os.path.join(directory, "throughput.png"))
        _plot_step_times(df, os.path.join(directory, "step_times.png"))
        _plot_vs_workers(df, "B/sample", "bytes sent per sample (all workers)", os.path.join(directory, "bytes.png"),
                         log=True)
        _plot_vs_workers(df, "peak RSS MiB", "peak resident memory per worker (MiB)",
                         os.path.join(directory, "memory.png"))
    headline = df[df["model"].isin(HEADLINE_MODELS)] if not df.empty else df
    below = df[~df["model"].isin(HEADLINE_MODELS)] if not df.empty else df

    lines = [f"# Benchmark report: {name}", ""]
    if config.get("description"):
        lines += [config["description"], ""]
    if note:
        lines += [f"**Note:** {note}", ""]
    shown = " and ".join({"dlrm": "DLRM", "deepfm": "DeepFM"}[m] for m in HEADLINE_MODELS
                         if not headline.empty and m in set(headline["model"])) or "The models"
    lines += [f"## Headline: {shown} end to end, against the best baseline a tuned user runs", "",
              "Samples/s of the whole training step (Parquet input pipeline, forward, backward, Adagrad) over all "
              "workers, median of the repeats with their spread, all measured in this one run. `/ best "
              "baseline@N`: over the fastest baseline at the same N (named): at N = 1 the stock Estimator or "
              "plain TF, as shipped or tuned; beyond, Horovod data parallelism (every table replicated, "
              "`hvd.DistributedOptimizer`), as shipped, tuned, or tuned with `sparse_as_dense`. `/ as shipped@N`: "
              "over the stock Estimator at N = 1 and Horovod DP as shipped beyond. `/ ceiling@N`: over the same "
              "model with its lookups replaced by constants (no tables), the limit of every mode.", "",
              WHY_AS_SHIPPED, "",
              _markdown(ratios(headline) if not headline.empty else headline, ",.3f"),
              "### Targets", "", _markdown(targets(df) if not df.empty else df, ",.3f")]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- `{r['run_id']}`: {str(r.get('error', '')).splitlines()[0] if r.get('error') else 'failed'}"
                  for r in failed] + [""]
    lines += ["## Machine", ""] + _machine_lines(records) + [""]
    if config:
        lines += [_run_line(config), ""]
    lines += ["## Throughput and step time", "", "![throughput](throughput.png)", "",
              "![step times](step_times.png)", "",
              _markdown(df[["model", "mode", "workers", "batch", "samples/s", "min", "max", "per worker",
                            "step p50 ms", "step p90 ms", "whole-table reads"]] if not df.empty else df),
              "`whole-table reads`: ops per step that read a whole table, counted in the graphs TensorFlow ran "
              "for one step after Grappler (`benchmarks.tracing.TableReads`, most ranks' count).", ""]
    lines += profiles_section(directory)
    lines += overhead_section(directory, df)
    for model in ([] if below.empty else sorted(set(below["model"]))):
        title, text = OTHER_MODELS.get(model, (model, ""))
        lines += [f"### {title}", "", text, "", _markdown(ratios(below[below["model"] == model]), ",.3f")]
    lines += ["## Bytes on the wire", "",
              "Measured: `collective.comm`'s byte counter over the timed steps (for Horovod DP the step adds what "
              "Horovod's allgather/allreduce send under the same byte model), summed over workers, per sample. "
              "Projected: `benchmarks.projection` on the batches each worker read in those steps. Lower bound: "
              "every distinct id a worker needs from another owner crosses once, its vector comes back and its "
              "gradient goes out once, plus the dense allreduce (same batches).", "",
              _markdown(df[["model", "mode", "workers", "batch", "B/sample", "projected B/sample",
                            "lower bound B/sample"]] if not df.empty else df),
              "![bytes](bytes.png)", "",
              "## Memory per worker", "", "![memory](memory.png)", "",
              _markdown(df[["model", "mode", "workers", "batch", "peak RSS MiB", "tables MiB/worker",
                            "tables MiB total", "per worker / (total / N)"]] if not df.empty else df),
              "Tables MiB count the tables and their Adagrad slots; `per worker / (total / N)` is 1 when the "
              "tables are split evenly and N when every worker holds them whole.", "",
              "## Training loss", "",
              "The mean training loss over the last repeat's steps, averaged over workers: every mode trains the "
              "same model on the same rows, so one model's losses agree.", "",
              _markdown(df[["model", "mode", "workers", "batch", "loss"]] if not df.empty else df, ",.4f")]
    if projected.get("real_rows"):
        from benchmarks import projection_report, real_projection  # pylint: disable=import-outside-toplevel

        lines += [projection_report.projection_section(projected["real_rows"],
                                                       real_projection.calibration_rows(records), directory), ""]
    if projected.get("reader"):
        reader = projected["reader"]
        lines += ["## Input pipeline", "",
                  f"`collective.data`'s Parquet reader pinned to one core (`benchmarks.data`), {reader['rows']:,} "
                  f"Criteo-shaped rows (40 columns), batch {reader['batch']:,}: "
                  f"**{reader['tf_data_rows_per_s']:,.0f} rows/s** as a `tf.data` pipeline consumed in the graph "
                  "(as a training step's `get_next`), "
                  f"{reader.get('tf_data_eager_rows_per_s', float('nan')):,.0f} rows/s iterated by a Python loop, "
                  f"{reader['numpy_rows_per_s']:,.0f} rows/s as numpy batches (medians of "
                  f"{len(reader.get('repeats', []))} repeats, load average {reader.get('load_average')}). "
                  "Target: 2,000,000 rows/s per core.", ""]
    path = os.path.join(directory, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    logger.info("wrote %s", path)
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
