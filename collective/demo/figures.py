"""The demo's pictures: training loss per step, samples/s and bytes/sample of each run, as PNG files."""

from __future__ import annotations

import os
from typing import List, Mapping

from collective.cli import plots

LOSS, SAMPLES, BYTES = "loss.png", "samples_per_sec.png", "bytes_per_sample.png"
# hb and sok start on the same curve (the same batches) and part only by float rounding, compounded.
_STYLES = {"plain": {"linewidth": 1.0, "alpha": 0.8}, "hb": {"linewidth": 1.0}, "sok": {"linewidth": 1.0,
                                                                                   "linestyle": "--"}}


def _label(name: str, metrics: Mapping[str, object]) -> str:
    workers = int(metrics["workers"])
    return f"{'plain TF' if name == 'plain' else name}\n{workers} {'process' if workers == 1 else 'workers'}"


def write(results: Mapping[str, Mapping[str, object]], report_dir: str) -> List[str]:
    """Writes the three plots of ``results`` (run name -> its ``metrics.json``) into ``report_dir``.

    Run names are ``plain``, ``hb`` and ``sok``; each ``metrics.json`` has
    ``loss_curve`` (``steps``, ``losses``), ``samples_per_sec``,
    ``bytes_per_sample`` and ``workers``. Returns the paths written.
    """
    os.makedirs(report_dir, exist_ok=True)
    names = list(results)
    labels = [_label(n, results[n]) for n in names]
    colors = [plots.COLORS.get(n, plots.OTHER_COLOR) for n in names]
    first = next(iter(results.values()))
    curves = {n: (r["loss_curve"]["steps"], r["loss_curve"]["losses"]) for n, r in results.items()}
    return [
        plots.line_chart(curves, os.path.join(report_dir, LOSS), xlabel="step",
                         ylabel="training loss (mean over the global batch)", styles=_STYLES,
                         title=f"{first['model'].upper()}, global batch {first['batch_size']}: hb and sok read the "
                               "same batches,\nplain TF in one process the same rows in another order"),
        plots.bar_chart(labels, [float(results[n]["samples_per_sec"]) for n in names],
                        os.path.join(report_dir, SAMPLES), ylabel="training samples/s (all workers)",
                        colors=colors, value_format="{:,.0f}", label_size=9,
                        title="training throughput"),
        plots.bar_chart(labels, [float(results[n]["bytes_per_sample"]) for n in names],
                        os.path.join(report_dir, BYTES), ylabel="bytes a worker sends per sample",
                        colors=colors, value_format="{:,.0f}", label_size=9,
                        title="communication per training sample"),
    ]
