"""The hosts benchmark: flat vs hierarchical exchange on simulated hosts, bytes counted on the hosts' links.

    sudo python -m benchmarks.hosts --out reports/hosts            # runs (root: local_hosts.sh), writes the report
    python -m benchmarks.hosts --out reports/hosts --report_only   # rebuilds REPORT.md and hosts.png from records/

For each link rate (``scripts/local_hosts.sh up 2 --rate R``: tbf, this kernel has no netem, so no delay) and
each shape (2 hosts x 1 worker, 2 hosts x 2 workers) :mod:`benchmarks.hosts_worker` trains one hb table, flat
(``COLLECTIVE_HIERARCHICAL=0``) and hierarchical; with one worker per host both are the flat exchange
(:func:`collective.sharding.planner.hierarchical_pays`), so that shape runs once. Each host's ``chosts`` link
counts the bytes it sends; :func:`modelled_steps` is the byte model of the same steps
(:func:`benchmarks.projection.host_step_bytes`: :func:`collective.byte_model.cross_host_counts` on the workers'
ids, each id 8 bytes out, its vector back and its gradient out again; :func:`wire_bytes` adds TCP/IP/Ethernet
framing per segment). :func:`project` takes the same id model, the links' rates and the step time measured off
the links to 128 hosts x 8 workers through :mod:`benchmarks.projection`'s two-level time model. Not part of
``make test``.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import subprocess
from typing import List, Optional, Sequence

import numpy as np

from benchmarks import projection
from benchmarks.hosts_worker import ids_of
from benchmarks.launching import hosts_command, worker_env
from benchmarks.markdown import markdown_table
from collective.cli import plots

logger = logging.getLogger("benchmarks.hosts")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATES = ("1gbit", "10gbit")
SHAPES = ("host0:1,host1:1", "host0:2,host1:2")
ID_BYTES, FLOAT_BYTES = 8, 4
MSS, FRAME_HEADERS = 1448, 66  # TCP payload per segment on a 1500-byte MTU; Ethernet 14 + IPv4 20 + TCP 32 (timestamps)


def _hosts_script(*args: str) -> None:
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "local_hosts.sh"), *args], check=True, timeout=300)


def run(out: str, steps: int, batch: int, vocab: int, dim: int) -> None:
    """Every rate x shape x exchange, records under ``out/records/<rate>_<workers>_<mode>/``."""
    try:
        for rate in RATES:
            _hosts_script("up", "2", "--rate", rate)
            for shape in SHAPES:
                workers = sum(int(h.split(":")[1]) for h in shape.split(","))
                for mode in ("flat", "hierarchical") if workers > 2 else ("flat",):
                    where = os.path.join(out, "records", f"{rate}_{workers}_{mode}")
                    os.makedirs(where, exist_ok=True)
                    env = worker_env(CUDA_VISIBLE_DEVICES="", COLLECTIVE_HIERARCHICAL="0" if mode == "flat" else "1")
                    cmd = hosts_command(shape, "benchmarks.hosts_worker", where, str(steps), str(batch), str(vocab),
                                        str(dim))
                    logger.info("%s %s %s", rate, shape, mode)
                    subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=900)
    finally:
        _hosts_script("down")


def link_rate(rate: str) -> float:
    """Bits per second of a tc rate as the runs name it (``1gbit``, ``10gbit``, ``100mbit``)."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"link rate {rate!r} is not a tc rate in {', '.join(units)} (e.g. 1gbit)")


def fabric(rate: str, cross: Optional[projection.Fabric] = None) -> projection.HostFabric:
    """The two-level fabric of the report: NVLink within a host, each host's link shaped to ``rate`` (tbf: no
    added latency), or ``cross`` in its place."""
    cross = cross or projection.Fabric(f"{rate} per host (tbf)", link_rate(rate) / 8, 0.0)
    return projection.HostFabric(f"{projection.FABRICS[0].name} within, {cross.name} across", projection.FABRICS[0],
                                 cross)


def modelled_steps(hosts: Sequence[Sequence[int]], record: dict, hierarchical: bool) -> List[projection.HostStepBytes]:
    """:func:`benchmarks.projection.host_step_bytes` of each timed step of a run, on the ids its workers looked up."""
    n = sum(len(r) for r in hosts)
    return [projection.host_step_bytes([ids_of(step, r, record["batch"], record["vocab"]) for r in range(n)], hosts,
                                       record["dim"], hierarchical)
            for step in range(record["warmup"], record["warmup"] + record["steps"])]


def wire_bytes(payload: float) -> float:
    """``payload`` bytes on the wire: TCP/IP/Ethernet framing per segment."""
    return payload + math.ceil(payload / MSS) * FRAME_HEADERS


def _hosts_of(shape_workers: int) -> List[List[int]]:
    per = shape_workers // 2
    return [list(range(per)), list(range(per, 2 * per))]


def load(out: str) -> List[dict]:
    """One row per run: measured and modelled bytes per sample that crossed hosts, samples/s, and the step's
    seconds off the cross-host link (measured step seconds less the modelled link time at the run's rate)."""
    rows = []
    for where in sorted(glob.glob(os.path.join(out, "records", "*"))):
        rate, workers, mode = os.path.basename(where).split("_")
        records = [json.load(open(p, encoding="utf-8")) for p in sorted(glob.glob(os.path.join(where, "rank*.json")))]
        hosts = _hosts_of(int(workers))
        first = {h: min((rec for rec in records if rec["rank"] in ranks), key=lambda rec: rec["rank"])
                 for h, ranks in enumerate(hosts)}
        sent = sum(first[h]["link"]["tx_bytes"] for h in first)
        rec = records[0]
        samples = rec["steps"] * rec["batch"] * int(workers)
        steps = modelled_steps(hosts, rec, mode == "hierarchical")
        payload = sum(float(step.cross.sum()) for step in steps)
        link = float(np.mean([projection.host_projected_seconds(step, hosts, fabric(rate)) for step in steps]))
        seconds = max(r["seconds"] for r in records)
        rows.append({"rate": rate, "workers": int(workers), "exchange": mode,
                     "hierarchical_used": all(r["hierarchical"] for r in records),
                     "samples_per_s": samples / seconds, "measured_B_per_sample": sent / samples,
                     "model_payload_B_per_sample": payload / samples,
                     "model_wire_B_per_sample": wire_bytes(payload) / samples,
                     "error": sent / wire_bytes(payload) - 1 if payload else float("nan"),
                     "off_link_seconds": max(seconds / rec["steps"] - link, 0.0), "record": rec})
    return rows


def project(record: dict, off_link_seconds: float, fabrics: Sequence[projection.HostFabric], hosts: int = 128,
            per_host: int = 8) -> List[dict]:
    """Both exchanges at ``hosts`` x ``per_host`` workers on each fabric: bytes per sample by level (one step's
    ids of the same id model) and samples/s with ``off_link_seconds`` per step besides the links."""
    n = hosts * per_host
    layout = [list(range(h * per_host, (h + 1) * per_host)) for h in range(hosts)]
    ids = [ids_of(record["warmup"], r, record["batch"], record["vocab"]) for r in range(n)]
    samples = record["batch"] * n
    rows = []
    for mode in ("flat", "hierarchical"):
        step = projection.host_step_bytes(ids, layout, record["dim"], mode == "hierarchical")
        for where in fabrics:
            link = projection.host_projected_seconds(step, layout, where)
            rows.append({"exchange": mode, "fabric": where.cross.name, "cross_B_per_sample": step.cross.sum() / samples,
                         "intra_B_per_sample": step.intra.sum() / samples, "link_seconds": link,
                         "samples_per_s": samples / (off_link_seconds + link), "link_bound": samples / link})
    return rows


def write_report(out: str) -> None:
    """``out/REPORT.md`` and ``out/hosts.png`` from ``out/records``."""
    rows = sorted(load(out), key=lambda r: (RATES.index(r["rate"]), r["workers"], r["exchange"]))
    table = [[r["rate"], f"2 x {r['workers'] // 2}", r["exchange"] + ("" if r["hierarchical_used"] or
                                                                      r["exchange"] == "flat" else " (flat ran)"),
              f"{r['samples_per_s']:,.0f}", f"{r['measured_B_per_sample']:,.1f}",
              f"{r['model_payload_B_per_sample']:,.1f}", f"{r['model_wire_B_per_sample']:,.1f}",
              f"{100 * r['error']:+.1f}%"] for r in rows]
    factors = []
    for rate in RATES:
        pair = {r["exchange"]: r for r in rows if r["rate"] == rate and r["workers"] == 4}
        if len(pair) == 2:
            measured = pair["flat"]["measured_B_per_sample"] / pair["hierarchical"]["measured_B_per_sample"]
            modelled = pair["flat"]["model_wire_B_per_sample"] / pair["hierarchical"]["model_wire_B_per_sample"]
            factors.append([rate, f"{measured:.3f}", f"{modelled:.3f}", f"{100 * (measured / modelled - 1):+.1f}%"])
    rec = rows[0]["record"] if rows else None
    busy = [r["off_link_seconds"] for r in rows if r["workers"] == 4]
    off_link = float(np.median(busy)) if busy else 0.0
    fabrics = [fabric(rate) for rate in RATES] + [fabric(RATES[-1], projection.FABRICS[1])]
    projected = project(rec, off_link, fabrics) if rec else []
    lines = ["# Several hosts: flat vs hierarchical exchange", "",
             "Regenerate: `sudo python -m benchmarks.hosts --out reports/hosts` (runs on simulated hosts, "
             "`scripts/local_hosts.sh`), or `--report_only` to rebuild this page from `records/`.", "",
             f"One hb table ({rec['vocab']:,} x {rec['dim']} float32), {rec['batch']} Zipf(1.2) ids per worker and "
             f"step, SGD, {rec['steps']} timed steps after {rec['warmup']} warm-up steps; CPU workers on one 2-core "
             "machine, each host a network namespace on one bridge. Links shaped by rate only (tbf): this kernel "
             "has no netem, so `--delay` is refused and no latency is added." if rec else "", "",
             "Measured: the bytes each host's `chosts` link sent during the timed steps (`/sys/class/net/chosts/"
             "statistics/tx_bytes` in its namespace), summed over hosts, per sample. Model: "
             "`benchmarks.projection.host_step_bytes` (`collective.byte_model.cross_host_counts`) on the same ids "
             "(8 bytes per id out, its vector back, its "
             f"gradient out), and on the wire with {FRAME_HEADERS} bytes of Ethernet/IPv4/TCP headers per "
             f"{MSS}-byte segment. The measured bytes also carry Horovod's coordination and TCP acknowledgements, "
             "which the model leaves out.", "",
             markdown_table(["link", "hosts x workers", "exchange", "samples/s", "measured B/sample",
                             "model payload B/sample", "model wire B/sample", "measured vs model wire"], table),
             "## Hierarchical vs flat (2 hosts x 2 workers)", "",
             markdown_table(["link", "flat / hierarchical measured", "model", "difference"], factors),
             "With one worker per host the hierarchical exchange would send what the flat one sends "
             "(`planner.hierarchical_pays` is false): that shape runs flat only.", "",
             "## Projection: 128 hosts x 8 workers", "",
             "`benchmarks.projection`'s two-level model (`host_step_bytes`, `host_projected_seconds`) at 1,024 "
             "workers on the same id model (ids of one step, `id % N` owners): bytes by level from "
             "`collective.byte_model.cross_host_counts` across hosts and each rank's distinct ids to its owner "
             "(flat) or relay (hierarchical) within a host; the busiest host's bytes at its link's rate, the "
             "busiest rank's within its host at NVLink's, and a latency per all-to-all hop. Each step also takes "
             f"{off_link * 1e3:,.0f} ms off the links: the median over the 2 x 2 runs above of the measured step "
             "time less the model's link time at the run's rate (this machine's compute and intra-host exchange, "
             "4 CPU workers on 2 cores), the same for both exchanges. Links: the measured runs' tbf rates per host "
             "(no latency: none was added) and, for comparison, InfiniBand with its latency.", "",
             markdown_table(["exchange", "link per host", "cross-host B/sample", "intra-host B/sample",
                             "link time/step", "samples/s", "samples/s, links alone"],
                            [[p["exchange"], p["fabric"], f"{p['cross_B_per_sample']:,.1f}",
                              f"{p['intra_B_per_sample']:,.1f}", f"{p['link_seconds'] * 1e3:,.2f} ms",
                              f"{p['samples_per_s']:,.0f}", f"{p['link_bound']:,.0f}"] for p in projected]),
             "Samples/s: CPU workers sharing 2 cores with each other (and the hosts' sshds), a few timed steps of "
             "under a second: CPU-bound and noisy, so they do not show the links' rates; the bytes are counted on "
             "the links.", "",
             "![bytes per sample](hosts.png)", ""]
    with open(os.path.join(out, "REPORT.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['rate']}\n2x{r['workers'] // 2}\n{r['exchange']}" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["measured_B_per_sample"] for r in rows], 0.4, label="measured on the links")
    ax.bar(x + 0.2, [r["model_wire_B_per_sample"] for r in rows], 0.4, label="byte model (framed)")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("cross-host bytes / sample")
    ax.legend(loc="lower center")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "hosts.png"), dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[hosts] %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "reports", "hosts"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--report_only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        run(args.out, args.steps, args.batch, args.vocab, args.dim)
    write_report(args.out)


if __name__ == "__main__":
    main()
