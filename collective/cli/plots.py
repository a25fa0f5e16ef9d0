"""PNG charts with matplotlib's Agg backend (no display needed), for the demo and the benchmark reports.

One colour per way of training, the same in every chart: plain TensorFlow
(``plain``, the benchmarks' ``tf_single``) grey, Horovod data parallelism
blue, ``hb`` red, ``sok`` green.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple

COLORS = {"plain": "#7f7f7f", "tf_single": "#7f7f7f", "tf_mts": "#7f7f7f", "estimator": "#bcbd22",
          "hvd_replicated": "#1f77b4", "hvd_dp": "#1f77b4", "replicated": "#9467bd", "hb": "#d62728",
          "hb_packed": "#ff7f0e", "sok": "#2ca02c"}
OTHER_COLOR = "#333333"


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (imported on first use: matplotlib is slow to load)."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    return plt


def bar_chart(labels: Sequence[str], values: Sequence[float], path: str, *, ylabel: str,
              colors: Optional[Sequence[str]] = None, title: Optional[str] = None,
              ylim: Optional[Tuple[float, float]] = None, value_format: Optional[str] = None,
              label_size: float = 7) -> str:
    """One bar per label, written to ``path``; ``value_format`` (e.g. ``"{:,.0f}"``) writes each value on its
    bar. Returns ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(values)), 4))
    bars = ax.bar(range(len(values)), values, color=list(colors) if colors else None)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=label_size)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if ylim:
        ax.set_ylim(*ylim)
    if value_format:
        ax.bar_label(bars, labels=[value_format.format(v) for v in values], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def line_chart(series: Mapping[str, Tuple[Sequence[float], Sequence[float]]], path: str, *, xlabel: str,
               ylabel: str, title: Optional[str] = None,
               styles: Optional[Mapping[str, Mapping[str, object]]] = None) -> str:
    """One line per ``name: (xs, ys)``, coloured by :data:`COLORS`, written to ``path``; ``styles`` adds
    matplotlib line options per name. Returns ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, label=name, color=COLORS.get(name, OTHER_COLOR), **dict((styles or {}).get(name, {})))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
