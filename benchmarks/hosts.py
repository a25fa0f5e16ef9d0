"""The hosts benchmark: flat vs hierarchical exchange on simulated hosts, bytes counted on the hosts' links.

    sudo python -m benchmarks.hosts --out reports/hosts            # runs (root: local_hosts.sh), writes the report
    python -m benchmarks.hosts --out reports/hosts --report_only   # rebuilds REPORT.md and hosts.png from records/

For each link rate (``scripts/local_hosts.sh up 2 --rate R``: tbf, this kernel has no netem, so no delay) and
each shape (2 hosts x 1 worker, 2 hosts x 2 workers) :mod:`benchmarks.hosts_worker` trains one hb table, flat
(``COLLECTIVE_HIERARCHICAL=0``) and hierarchical; with one worker per host both are the flat exchange
(:func:`collective.sharding.planner.hierarchical_pays`), so that shape runs once. Each host's ``chosts`` link
counts the bytes it sends; :func:`model_bytes` is the byte model of the same steps
(:func:`collective.byte_model.cross_host_ids` on the workers' ids, each id 8 bytes out, its vector back and
its gradient out again, plus TCP/IP/Ethernet framing per segment). The projection takes the same ids and
rates to 128 hosts x 8 workers. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
import subprocess
from typing import Dict, List, Sequence

import numpy as np

from benchmarks.hosts_worker import ids_of
from benchmarks.launching import hosts_command, worker_env
from benchmarks.markdown import markdown_table
from collective.byte_model import cross_host_ids
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


def model_bytes(hosts: Sequence[Sequence[int]], record: dict, hierarchical: bool) -> Dict[str, float]:
    """The byte model of a run's timed steps: payload crossing hosts and the same on the wire (framed)."""
    n = sum(len(r) for r in hosts)
    crossing = 0
    for step in range(record["warmup"], record["warmup"] + record["steps"]):
        ids = [ids_of(step, r, record["batch"], record["vocab"]) for r in range(n)]
        crossing += cross_host_ids(ids, lambda i: np.asarray(i) % n, hosts, hierarchical)
    payload = crossing * (ID_BYTES + 2 * record["dim"] * FLOAT_BYTES)
    return {"ids": crossing, "payload": payload, "wire": payload + math.ceil(payload / MSS) * FRAME_HEADERS}


def _hosts_of(shape_workers: int) -> List[List[int]]:
    per = shape_workers // 2
    return [list(range(per)), list(range(per, 2 * per))]


def load(out: str) -> List[dict]:
    """One row per run: measured and modelled bytes per sample that crossed hosts, samples/s."""
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
        model = model_bytes(hosts, rec, mode == "hierarchical")
        seconds = max(r["seconds"] for r in records)
        rows.append({"rate": rate, "workers": int(workers), "exchange": mode,
                     "hierarchical_used": all(r["hierarchical"] for r in records),
                     "samples_per_s": samples / seconds, "measured_B_per_sample": sent / samples,
                     "model_payload_B_per_sample": model["payload"] / samples,
                     "model_wire_B_per_sample": model["wire"] / samples,
                     "error": sent / model["wire"] - 1 if model["wire"] else float("nan"), "record": rec})
    return rows


def projection(record: dict, hosts: int = 128, per_host: int = 8) -> Dict[str, float]:
    """Cross-host bytes per sample at ``hosts`` x ``per_host`` from the same id model, flat and hierarchical."""
    n = hosts * per_host
    layout = [list(range(h * per_host, (h + 1) * per_host)) for h in range(hosts)]
    ids = [ids_of(record["warmup"], r, record["batch"], record["vocab"]) for r in range(n)]
    samples = record["batch"] * n
    row = ID_BYTES + 2 * record["dim"] * FLOAT_BYTES
    return {mode: cross_host_ids(ids, lambda i: np.asarray(i) % n, layout, mode == "hierarchical") * row / samples
            for mode in ("flat", "hierarchical")}


def _bound(bits_per_second: float, bytes_per_sample: float, hosts: int = 128) -> float:
    return bits_per_second / 8 * hosts / bytes_per_sample if bytes_per_sample else float("inf")


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
    projected = projection(rec) if rec else {}
    lines = ["# Several hosts: flat vs hierarchical exchange", "",
             "Regenerate: `sudo python -m benchmarks.hosts --out reports/hosts` (runs on simulated hosts, "
             "`scripts/local_hosts.sh`), or `--report_only` to rebuild this page from `records/`.", "",
             f"One hb table ({rec['vocab']:,} x {rec['dim']} float32), {rec['batch']} Zipf(1.2) ids per worker and "
             f"step, SGD, {rec['steps']} timed steps after {rec['warmup']} warm-up steps; CPU workers on one 2-core "
             "machine, each host a network namespace on one bridge. Links shaped by rate only (tbf): this kernel "
             "has no netem, so `--delay` is refused and no latency is added." if rec else "", "",
             "Measured: the bytes each host's `chosts` link sent during the timed steps (`/sys/class/net/chosts/"
             "statistics/tx_bytes` in its namespace), summed over hosts, per sample. Model: "
             "`collective.byte_model.cross_host_ids` on the same ids (8 bytes per id out, its vector back, its "
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
             "The same id model and byte model at 1,024 workers (ids of one step, `id % N` owners):", "",
             markdown_table(["exchange", "cross-host B/sample", "1 Gbit/s per host: samples/s bound",
                             "10 Gbit/s per host"],
                            [[m, f"{b:,.1f}", f"{_bound(1e9, b):,.0f}", f"{_bound(1e10, b):,.0f}"]
                             for m, b in projected.items()]),
             "The bound: global samples per second at which each host's link (bits/s / 8 bytes/s) carries its "
             "share (1/128) of the cross-host bytes per sample; the step's compute is left out.", "",
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
