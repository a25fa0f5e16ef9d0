"""``OUT/stream.json`` (:mod:`benchmarks.stream`) -> ``OUT/REPORT.md`` and ``OUT/stream.png``.

    python -m benchmarks.stream_report --dir reports/stream
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from benchmarks.markdown import markdown_table
from collective.cli import plots

REFERENCE = "unbounded"
AUC_GOAL = 0.002
PLOT = "stream.png"


def _by_variant(rows: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["variant"], []).append(row)
    return {name: sorted(days, key=lambda r: r["day"]) for name, days in out.items()}


def summary(result: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """Per variant: table memory on the last day over day 3's, and the next-day AUC gap to :data:`REFERENCE`."""
    variants = _by_variant(result["rows"])
    reference = {r["day"]: r["next_day_auc"] for r in variants.get(REFERENCE, [])}
    out = {}
    for name, days in variants.items():
        memory = [float(np.mean(r["table_bytes"])) for r in days]
        gaps = [r["next_day_auc"] - reference[r["day"]] for r in days
                if r["next_day_auc"] is not None and reference.get(r["day"]) is not None]
        settled = memory[min(2, len(memory) - 1)]
        out[name] = {"last_day_table_mib": memory[-1] / 2 ** 20,
                     "growth_after_day_3": memory[-1] / settled if settled else float("nan"),
                     "mean_auc_gap": float(np.mean(gaps)) if gaps else float("nan"),
                     "worst_auc_gap": float(min(gaps)) if gaps else float("nan")}
    return out


def _plot(result: Dict[str, Any], path: str) -> None:
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for i, (name, days) in enumerate(_by_variant(result["rows"]).items()):
        color = f"C{i}"
        x = [r["day"] + 1 for r in days]
        axes[0].plot(x, [np.mean(r["table_bytes"]) / 2 ** 20 for r in days], marker="o", color=color, label=name)
        axes[1].plot(x, [r["samples_per_s"] for r in days], marker="o", color=color, label=name)
        auc_days = [(r["day"] + 2, r["next_day_auc"]) for r in days if r["next_day_auc"] is not None]
        axes[2].plot([d for d, _ in auc_days], [a for _, a in auc_days], marker="o", color=color, label=name)
    for ax, title in zip(axes, ["table memory per worker (MiB, held rows + slots)", "samples/s (slowest worker)",
                                "AUC on the next day, before training it"]):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("day")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(out_dir: str) -> str:
    """Writes ``REPORT.md`` and the plot from ``out_dir/stream.json``; returns the report's path."""
    with open(os.path.join(out_dir, "stream.json"), encoding="utf-8") as f:
        result = json.load(f)
    config = result["config"]
    _plot(result, os.path.join(out_dir, PLOT))
    body = []
    for row in result["rows"]:
        body.append([row["variant"], str(row["day"] + 1), " / ".join(f"{n:,}" for n in row["rows_held"]),
                     f"{np.mean(row['table_bytes']) / 2 ** 20:,.1f}",
                     f"{np.mean(row['allocated_bytes']) / 2 ** 20:,.1f}",
                     f"{np.mean(row['rss_bytes']) / 2 ** 20:,.0f}", f"{row['samples_per_s']:,.0f}",
                     "n/a" if row["next_day_auc"] is None else f"{row['next_day_auc']:.4f}"])
    table = markdown_table(["variant", "day", "rows held per worker", "table MiB/worker", "allocated MiB/worker",
                            "RSS MiB/worker", "samples/s", "next-day AUC"], body)
    sums = summary(result)
    verdict = markdown_table(
        ["variant", "table MiB/worker, last day", "last day / day 3", f"mean AUC gap to {REFERENCE}",
         "worst day's gap", f"AUC within {AUC_GOAL}"],
        [[name, f"{s['last_day_table_mib']:,.1f}", f"{s['growth_after_day_3']:.2f}", f"{s['mean_auc_gap']:+.4f}",
          f"{s['worst_auc_gap']:+.4f}", "yes" if abs(s["mean_auc_gap"]) <= AUC_GOAL else "no"]
         for name, s in sums.items()])
    policies = "\n".join(f"- `{name}`: `hash_embedding_variable(..., {', '.join(f'{k}={v!r}' for k, v in kw.items())})`"
                         for name, kw in config["variants"].items())
    text = f"""# Stream benchmark: a vocabulary that lives for {config['days']} days

`python -m benchmarks.stream` (:mod:`benchmarks.stream`). {config['days']} days of
{config['samples_per_day']:,} samples, {config['fields']} id fields in one hash table (dim {config['dim']}, Adagrad,
an MLP of 64), global batch {config['global_batch']:,}, {config['workers']} workers (hb), one pass per day. Each day
a head of {config['head']:,} popular ids per field ({config['new_head_share']:.0%} of it new each day, popularity
moving within it) and {config['tail_share']:.0%} of occurrences from ids seen exactly once; labels depend on the
head ids only. The AUC of day d+1 is measured before training it, with inference lookups (keys the table does
not hold read the default). Table memory counts held rows with their optimizer slot; "allocated" is the
values, slot and index variables as created (capacity_per_worker {config['capacity_per_worker']:,}).

Variants:
{policies}

![stream]({PLOT})

## Summary

{verdict}
## Per day

{table}"""
    path = os.path.join(out_dir, "REPORT.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_report", description=__doc__)
    parser.add_argument("--dir", default=os.path.join("reports", "stream"))
    args = parser.parse_args(argv)
    print(write(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
