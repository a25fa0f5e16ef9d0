"""``OUT/online.json`` (:mod:`benchmarks.online`) -> ``OUT/REPORT.md`` with ``online.png`` and ``intervals.png``.

    python -m benchmarks.online --config full --report_only
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from benchmarks.markdown import markdown_table
from collective.cli import plots

READY_GOAL_S = 10.0  # issue 32: a new serving version in under 10 s at real sizes
DELTA_GOAL = 2.0  # issue 32: a delta costs at most 2x (touched bytes / disk bandwidth)
MB = 1e6


def _s(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _mb(value: float) -> str:
    return f"{value / MB:,.1f}"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _tables(runs: List[Dict[str, Any]]) -> str:
    header = ["", *[f"N = {run['workers']}" for run in runs]]
    m = [run["median"] for run in runs]
    rows = [
        ["full checkpoint: bytes (MB)", *[_mb(run["full_save_bytes"]) for run in runs]],
        ["delta: bytes (MB)", *[_mb(x["delta_bytes"]) for x in m]],
        ["delta / full: bytes", *[f"{x['delta_bytes'] / run['full_save_bytes']:.4f}" for x, run in zip(m, runs)]],
        ["delta: rows (1% touched)", *[f"{x['delta_rows']:,.0f}" for x in m]],
        ["full save (s)", *[_s(x["full_save_s"]) for x in m]],
        ["delta save (s)", *[_s(x["delta_save_s"]) for x in m]],
        ["delta / full: save time", *[f"{x['delta_save_s'] / x['full_save_s']:.3f}" for x in m]],
        ["disk write + fsync of the delta's size (s)", *[_s(x["disk_write_s"]) for x in m]],
        ["disk bandwidth (MB/s)", *[_mb(run["disk_bytes_per_s"]) for run in runs]],
        [f"goal: delta save <= {DELTA_GOAL:g} x touched bytes / bandwidth (s)",
         *[f"{_s(run['delta_goal_s'])}: {_met(run['median']['delta_save_s'] <= run['delta_goal_s'])}"
           for run in runs]],
        ["restore: base (s)", *[_s(x["restore_base_s"]) for x in m]],
        [f"restore: base + {runs[0]['chain_deltas']} deltas (s)", *[_s(x["restore_chain_s"]) for x in m]],
        ["full export (s)", *[_s(x["full_export_s"]) for x in m]],
        ["serving update (s)", *[_s(x["update_s"]) for x in m]],
        ["serving update: bytes written (MB)", *[_mb(x["update_bytes"]) for x in m]],
        ["last step -> new version, full: save + export (s)", *[_s(run["full_path_s"]) for run in runs]],
        ["last step -> new version, delta: delta save + update (s)", *[_s(x["ready_s"]) for x in m]],
        [f"goal: new version in < {READY_GOAL_S:g} s", *[_met(x["ready_s"] < READY_GOAL_S) for x in m]],
        ["delta path / full path", *[f"{x['ready_s'] / run['full_path_s']:.3f}" for x, run in zip(m, runs)]],
        ["plain-TF load: the full export (s)", *[_s(run["load_full_s"]) for run in runs]],
        [f"plain-TF load: the newest version, {runs[0]['chain_deltas']} deltas applied (s)",
         *[_s(run["load_s"]) for run in runs]],
        ["served rows vs trained rows: largest difference", *[f"{run['served_max_abs_diff']:.1e}" for run in runs]],
        ["peak memory per worker (GB)", *[f"{run['peak_rss_bytes'] / 1e9:.1f}" for run in runs]],
    ]
    return markdown_table(header, rows)


def _plots(out: str, runs: List[Dict[str, Any]]) -> List[str]:
    plt = plots.pyplot()
    labels = ["full save", "delta save", "full export", "serving update", "full path", "delta path",
              "restore base", "restore chain"]
    keys = ["full_save_s", "delta_save_s", "full_export_s", "update_s", None, "ready_s", "restore_base_s",
            "restore_chain_s"]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        values = [run["full_path_s"] if key is None else run["median"][key] for key in keys]
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=f"N = {run['workers']}")
    ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (median, log scale)")
    ax.axhline(READY_GOAL_S, color="#d62728", linestyle="--", linewidth=1, label=f"{READY_GOAL_S:g} s goal")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "online.png"), dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    quantities = [("delta_save_s", "delta save", "#1f77b4"), ("update_s", "serving update", "#2ca02c"),
                  ("ready_s", "last step -> new version", "#d62728")]
    for run, style in zip(runs, ["-", "--", ":", "-."]):
        samples = run["samples"]
        xs = list(range(1, len(samples["ready_s"]) + 1))
        for key, label, color in quantities:
            ax.plot(xs, samples[key], style, color=color, marker="o", markersize=3,
                    label=f"{label}, N = {run['workers']}")
    ax.set_xlabel("interval (one training step, one delta, one version)")
    ax.set_ylabel("seconds")
    ax.set_title("Each interval (the first includes building the delta ops' first run)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "intervals.png"), dpi=100)
    plt.close(fig)
    return ["online.png", "intervals.png"]


def write(out: str) -> str:
    """Writes ``out/REPORT.md`` (and its plots) from ``out/online.json``; returns the report's path."""
    with open(os.path.join(out, "online.json")) as f:
        result = json.load(f)
    config, runs, host = result["config"], result["runs"], result["machine"]
    images = _plots(out, runs)
    lines = [
        f"# Online training: incremental checkpoints and serving updates ({config['name']})",
        "",
        f"{config['description']}: {runs[0]['rows']:,} rows in {runs[0]['tables']} tables, dim {config['dim']}, "
        f"Adagrad (one "
        f"slot), hb; one interval = one training step touching {config['touched']:.0%} of every table's rows "
        f"(distinct, drawn afresh), then a delta; {config['deltas']} intervals after the last of "
        f"{config['repeats']} full saves. Medians: over the {config['deltas']} intervals for delta, update and "
        f"disk times, over {config['repeats']} repeats for full saves, exports and restores; per measurement the "
        f"slowest worker. Ratios are from this one run. Produced by `python -m benchmarks.online --config "
        f"{config['name']}` (`benchmarks/online.py`).",
        "",
        f"Machine: {host['cpu_model']}, {host['usable_cores']} usable cores, load average "
        f"{', '.join(str(x) for x in host['load_average'])} at the end; TensorFlow "
        f"{host['libraries']['tensorflow']}; commit {host['collective_commit']}. Worker counts: "
        f"{', '.join(str(run['workers']) for run in runs)}.",
        "",
        _tables(runs),
        "- **touched bytes** are the delta's rows times (values + Adagrad slot + int64 key); the delta adds the "
        "dense variables and the bundle's index. The disk bandwidth is a file of the delta's size written and "
        "fsynced in the same run; TensorFlow's saves (full and delta) do not fsync, so they may finish in the "
        "page cache before the disk has the bytes.",
        "- **full path**: `Saver.save` then `export_saved_model` from that checkpoint (rank 0 builds the serving "
        "graph, restores whole tables, writes the SavedModel). **delta path**: `Saver.save_incremental` then "
        "`update_saved_model` (the last version's files hard-linked into the new version, one bundle of the "
        "changed rows written: no table, slot or graph is read or written; the version's restore op applies "
        "its deltas when a server loads it, the last load row).",
        "- Every timed write starts after `os.sync()`, on an idle disk, as when intervals are minutes apart; "
        "back to back, a save would wait for the writeback of the one before.",
        "- **restore** is `Saver.restore` on every worker of the same job, of the base alone and of the base "
        "plus every delta; the files were written minutes before, so they are read from the page cache as much "
        "as memory allows.",
        "- **served rows**: the newest version loaded by `tf.compat.v1.saved_model.load` in a fresh graph looks "
        "up the last interval's ids; they equal the trained model's rows.",
        "",
        *[f"![{name}]({name})" for name in images],
        "",
    ]
    path = os.path.join(out, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path
