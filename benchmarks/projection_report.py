"""The REPORT.md section of the real-table-size projection: tables, winners per fabric, one plot.

    rows = real_projection.projection_rows(batch_size=..., dim=...)
    calibration = real_projection.calibration_rows(report.load_records(out_dir))
    markdown = projection_section(rows, calibration, out_dir)   # writes out_dir/projection_real.png
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from benchmarks.markdown import markdown_table
from benchmarks.projection import BACKENDS, FABRICS
from collective.cli import plots

PLOT = "projection_real.png"
SHOWN_WORKERS = (2, 3, 8, 64, 256, 1024)


def _by_key(rows: Sequence[Mapping[str, Any]]) -> Dict[Tuple[str, int, str], Mapping[str, Any]]:
    return {(r["dataset"], r["workers"], r["backend"]): r for r in rows}


def _datasets(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    return list(dict.fromkeys(r["dataset"] for r in rows))


def _workers(rows: Sequence[Mapping[str, Any]], dataset: str) -> List[int]:
    return sorted({r["workers"] for r in rows if r["dataset"] == dataset and r["workers"] > 1})


def winners(rows: Sequence[Mapping[str, Any]]) -> Dict[Tuple[str, str], List[Tuple[str, int, int]]]:
    """Per (dataset, fabric name): ``(backend, first N, last N)`` runs of the fastest backend over N >= 2."""
    index = _by_key(rows)
    out = {}
    for dataset in _datasets(rows):
        for fabric in FABRICS:
            runs: List[Tuple[str, int, int]] = []
            for n in _workers(rows, dataset):
                key = f"seconds[{fabric.name}]"
                best = min((b for b in BACKENDS if (dataset, n, b) in index), key=lambda b: index[dataset, n, b][key])
                if runs and runs[-1][0] == best:
                    runs[-1] = (best, runs[-1][1], n)
                else:
                    runs.append((best, n, n))
            out[dataset, fabric.name] = runs
    return out


def _plot(rows: Sequence[Mapping[str, Any]], path: str) -> str:
    """Per dataset: bytes/sample vs N (and the lower bound), time per step vs N per fabric, winners shaded."""
    plt = plots.pyplot()
    datasets = _datasets(rows)
    index = _by_key(rows)
    fig, axes = plt.subplots(len(datasets), 1 + len(FABRICS), figsize=(5 * (1 + len(FABRICS)), 3.6 * len(datasets)),
                             squeeze=False)
    best = winners(rows)
    for axrow, dataset in zip(axes, datasets):
        ns = _workers(rows, dataset)
        for backend in BACKENDS:
            axrow[0].plot(ns, [index[dataset, n, backend]["bytes_per_sample"] for n in ns], marker=".",
                          color=plots.COLORS.get(backend, plots.OTHER_COLOR), label=backend)
        axrow[0].plot(ns, [index[dataset, n, BACKENDS[0]]["lower_bound_per_sample"] for n in ns], "k--",
                      label="dedup lower bound")
        axrow[0].set_ylabel("bytes / sample")
        axrow[0].set_title(dataset, fontsize=9)
        for ax, fabric in zip(axrow[1:], FABRICS):
            key = f"seconds[{fabric.name}]"
            for backend in BACKENDS:
                ax.plot(ns, [index[dataset, n, backend][key] * 1e3 for n in ns], marker=".",
                        color=plots.COLORS.get(backend, plots.OTHER_COLOR), label=backend)
            for backend, lo, hi in best[dataset, fabric.name]:
                i, j = ns.index(lo), ns.index(hi)
                left = math.sqrt(ns[i - 1] * lo) if i else lo / math.sqrt(2)
                right = math.sqrt(hi * ns[j + 1]) if j + 1 < len(ns) else hi * math.sqrt(2)
                ax.axvspan(left, right, color=plots.COLORS.get(backend, plots.OTHER_COLOR), alpha=0.12)
            ax.set_ylabel("comm ms / step (shaded: fastest)")
            ax.set_title(f"{dataset}: {fabric.name}", fontsize=8)
        for ax in axrow:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("workers N")
            ax.grid(alpha=0.3, which="both")
        axrow[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _calibration_lines(calibration: Sequence[Mapping[str, Any]]) -> List[str]:
    if not calibration:
        return ["_No measured runs of hb, sok or hvd_replicated on 2 or more workers: the model is not "
                "calibrated here._", ""]
    body = [[c["model"], c["backend"], str(c["workers"]), str(c["batch_size"]), f"{c['scale']:g}",
             f"{c['measured_bytes_per_sample']:,.1f}", f"{c['model_bytes_per_sample']:,.1f}",
             f"{c['error_pct']:+.2f}%",
             "" if c["sampled_bytes_per_sample"] is None else f"{c['sampled_bytes_per_sample']:,.1f}",
             f"{c['measured_over_lower_bound']:.3f}"] for c in calibration]
    worst = max(calibration, key=lambda c: abs(c["error_pct"]))
    return [markdown_table(["model", "backend", "N", "batch/worker", "scale", "measured B/sample", "model B/sample",
                    "error", "counted on the run's batches", "measured / lower bound"], body),
            f"Largest error: {worst['error_pct']:+.2f}% ({worst['backend']}, N = {worst['workers']}). sok's bytes "
            "do not depend on the ids; hb's and hvd_replicated's do, through the distinct ids per worker. The "
            "model is an expectation, the measurement one run's batches.", ""]


def projection_section(rows: Sequence[Mapping[str, Any]], calibration: Sequence[Mapping[str, Any]],
                       out_dir: str) -> str:
    """The markdown section for REPORT.md; writes its plot to ``out_dir``."""
    if not rows:
        return "## Communication at real table sizes\n\n_(no projection rows)_\n"
    _plot(rows, os.path.join(out_dir, PLOT))
    first = rows[0]
    index = _by_key(rows)
    lines = ["## Communication at real table sizes (projection)", "",
             f"The `{first['model']}` model at Criteo's real table sizes, per-worker batch {first['batch_size']}, "
             f"embedding dim {first['dim']}, N = 2 ... {max(r['workers'] for r in rows)}. Each table's ids follow "
             f"the synthetic generator's power law (exponent {first['exponent']:g}) over the table's full size; "
             "the distinct ids per worker and per (source, owner) pair are closed-form expectations "
             "(`benchmarks/id_model.py`), turned into bytes by the byte model the workers' counter uses. Table "
             "sizes: Criteo Kaggle's 26 column cardinalities (33.8M rows), and Criteo 1TB as MLPerf's DLRM "
             "reference hashes it (at most 40M rows per table, 204M in all); sources in "
             "`benchmarks/real_projection.py`. Under hb and sok a table with fewer rows than workers stays "
             "whole on every worker and its gradient is allreduced as dense sums. Dedup lower bound: every distinct id a worker "
             "needs from another owner crosses once (8 B), its vector comes back and its gradient goes out "
             "once, plus the dense allreduce.", "",
             "### Calibration: the same model at the measured configurations", ""]
    lines += _calibration_lines(calibration)
    lines += ["### Projected bytes per sample", "", f"![projection]({PLOT})", ""]
    for dataset in _datasets(rows):
        body = []
        for n in [n for n in _workers(rows, dataset) if n in SHOWN_WORKERS]:
            cells = [f"{index[dataset, n, b]['bytes_per_sample']:,.0f}" for b in BACKENDS]
            hb = index[dataset, n, "hb"]
            body.append([str(n)] + cells + [f"{hb['lower_bound_per_sample']:,.0f}",
                                             f"{hb['over_lower_bound']:.2f}x"])
        lines += [f"**{dataset}**", "", markdown_table(["N"] + list(BACKENDS) + ["dedup lower bound", "hb / lower bound"],
                                              body)]
    lines += ["### Projected communication time per step and the fastest backend", "",
              "Model: `calls x latency x hops + busiest worker's bytes / bandwidth` (hops N-1 for alltoall, "
              "ceil(log2 N) for the others); " + "; ".join(f.name for f in FABRICS) + ". NVLink spans one node "
              "(8 GPUs) in practice; its larger N show the latency term alone.", ""]
    best = winners(rows)
    body = []
    for (dataset, fabric), runs in best.items():
        spans = ", ".join(f"{b} (N = {lo}" + (f"..{hi})" if hi != lo else ")") for b, lo, hi in runs)
        at = [n for n in _workers(rows, dataset) if n in SHOWN_WORKERS]
        times = "; ".join(f"N={n}: " + " / ".join(f"{index[dataset, n, b][f'seconds[{fabric}]'] * 1e3:.3g}"
                                                   for b in BACKENDS) for n in at)
        body.append([dataset, fabric, spans, times])
    lines += [markdown_table(["dataset", "fabric", "fastest", "ms per step (" + " / ".join(BACKENDS) + ")"], body)]
    return "\n".join(lines)
