"""Communication per step at Criteo's real table sizes, N = 1 ... 1024, from expected distinct ids.

:mod:`benchmarks.projection` counts bytes on drawn batches, which at real
table sizes and 1024 workers would take ``1024 x b`` rows per step. Here
each table's lookup is modelled in expectation instead: every worker draws
its ``b`` ids from the table's frequency model (:mod:`benchmarks.id_model`:
the synthetic generator's power law, exponent 1.1, over the table's full
cardinality), so the distinct ids per worker and per (source, owner) pair
are closed-form sums, and :func:`benchmarks.projection.traffic_bytes` (the
byte model the sampled projection and the workers' counter share) turns
them into bytes per worker.

Why the generator's law: no Criteo click logs are on this machine to fit a
per-table law, and the generator's is the one the measured runs draw from,
so :func:`calibration_rows` checks the whole chain (law, closed form, byte
model) against the bytes the workers counted. Real Criteo tables differ in
skew; the projection's exponent is a parameter.

Table sizes (:data:`DATASETS`):

- Criteo Kaggle (Display Advertising Challenge, 45,840,617 rows): the
  distinct values per column, :data:`datasets.schema.KAGGLE_CARDINALITIES`
  (33,762,577 rows in all), as in the DLRM reference's Kaggle preprocessing.
- Criteo 1TB (24 days, about 4.4 billion rows) as MLPerf Training's DLRM
  (DCNv2) reference uses it: each column's distinct values over days 0-23,
  ids hashed to at most 40,000,000 (``--num_embeddings_per_feature`` of
  ``mlcommons/training`` ``recommendation_v2/torchrec_dlrm``; the same list
  in torchrec's ``examples/dlrm``; 204,184,588 rows in all). Hashing merges
  ids only in the five capped tables, and a worker's batch of thousands of
  ids practically never holds two merged ones, so the law is applied to the
  capped sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from benchmarks.config import TABLES_OUTSIDE_SCOPE
from benchmarks.tables import table_sizes
from benchmarks.id_model import PowerLaw, expected_owned, expected_unique
from benchmarks.projection import (BACKENDS, FABRICS, WORKER_COUNTS, TableTraffic, head_param_bytes,
                                   lower_bound_bytes, model_tables, projected_seconds, traffic_bytes)
from benchmarks.projection_report import projection_section
from collective.byte_model import bytes_per_sample
from collective.cli import add_flag
from datasets import schema
from datasets.synthetic.generate import DEFAULT_ZIPF


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A named set of 26 categorical table sizes (C1..C26)."""

    name: str
    cardinalities: Tuple[int, ...]


CRITEO_KAGGLE = Dataset("Criteo Kaggle", tuple(schema.KAGGLE_CARDINALITIES))
CRITEO_1TB = Dataset("Criteo 1TB (MLPerf, hashed to 40M)", (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4,
    976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36))
DATASETS = (CRITEO_KAGGLE, CRITEO_1TB)
# The byte model of each measured mode (benchmark records name Horovod data parallelism either way).
MODE_BACKENDS = {"hb": "hb", "sok": "sok", "hvd_replicated": "hvd_replicated", "hvd_dp": "hvd_replicated"}


def expected_traffic(law: PowerLaw, column: int, dim: int, group: int, n: int, batch_size: int) -> TableTraffic:
    """One table's :class:`TableTraffic` in expectation: every worker draws ``batch_size`` ids from ``law``.

    Worker ``w`` holds ``U`` distinct ids of which ``O_w`` are its own, so it
    asks others for ``U - O_w`` and each of the other ``n - 1`` workers asks
    it for ``O_w`` (``column`` picks the rank -> id scatter).
    """
    unique = expected_unique(law, batch_size)
    owned = expected_owned(law, batch_size, n, column)
    return TableTraffic(law.size, dim, group, np.full(n, unique), unique - owned, (n - 1) * owned)


def expected_tables(vocabs: Sequence[int], model: str, dim: int, n: int, batch_size: int,
                    exponent: float = DEFAULT_ZIPF) -> List[TableTraffic]:
    """:func:`expected_traffic` of every table of ``model`` (:func:`benchmarks.projection.model_tables`)."""
    columns, sizes, dims, groups = model_tables(model, vocabs, dim)
    return [expected_traffic(PowerLaw(size, exponent), column, width, group, n, batch_size)
            for column, size, width, group in zip(columns, sizes, dims, groups)]


def _dense_bytes(model: str, dim: int, given: Optional[Sequence[int]],
                 tables: int = len(schema.CATEGORICAL)) -> List[int]:
    if given is not None:
        return list(given)
    if model == "embedding":
        return head_param_bytes(tables, dim, len(schema.DENSE))
    raise ValueError(f"model {model!r}: pass dense_param_bytes (the sizes of its dense variables; a benchmark "
                     f"worker reports them as dense_param_bytes)")


def projection_rows(datasets: Iterable[Dataset] = DATASETS, *, model: str = "embedding", dim: int = 16,
                    batch_size: int = 1024, worker_counts: Iterable[int] = WORKER_COUNTS,
                    exponent: float = DEFAULT_ZIPF,
                    dense_param_bytes: Optional[Sequence[int]] = None) -> List[Dict[str, Any]]:
    """One row per dataset x worker count x backend: bytes/sample, dedup lower bound, time per fabric.

    ``batch_size`` is per worker (N workers train N x that); ``seconds[<fabric>]``
    is :func:`benchmarks.projection.projected_seconds` of the expected step.
    """
    dense = _dense_bytes(model, dim, dense_param_bytes)
    rows = []
    for data in datasets:
        for n in worker_counts:
            tables = expected_tables(data.cardinalities, model, dim, n, batch_size, exponent)
            bound = lower_bound_bytes(tables, n, dense)
            for backend in BACKENDS:
                step = traffic_bytes(tables, n, batch_size, backend, dense)
                row = {"dataset": data.name, "model": model, "backend": backend, "workers": n,
                       "batch_size": batch_size, "dim": dim, "exponent": exponent,
                       "bytes_per_step": float(step.total), "bytes_per_sample": bytes_per_sample(step.total,
                                                                                                 n * batch_size),
                       "lower_bound_per_sample": bytes_per_sample(bound, n * batch_size),
                       "max_worker_bytes": float(step.per_worker.max())}
                row["over_lower_bound"] = row["bytes_per_step"] / bound if bound else float("nan")
                for fabric in FABRICS:
                    row[f"seconds[{fabric.name}]"] = projected_seconds(step, n, fabric)
                rows.append(row)
    return rows


def calibration_rows(records: Iterable[Mapping[str, Any]], exponent: float = DEFAULT_ZIPF) -> List[Dict[str, Any]]:
    """The model at each measured configuration against the bytes the workers counted.

    ``records`` are :mod:`benchmarks.run` records (``worker_batch`` or
    ``batch_size`` rows per worker, ``spec`` with ``scale`` and ``dim``);
    successful runs of the modes in :data:`MODE_BACKENDS` on two or more
    workers are used (a record without ``dense_param_bytes`` only for the
    ``embedding`` model, whose dense variables are the linear head).
    ``error_pct`` is ``100 * (model - measured) / measured``;
    ``sampled_bytes_per_sample`` is the exact count on the run's own batches
    (:mod:`benchmarks.projection`), when the record has it.
    """
    rows = []
    for record in records:
        backend = MODE_BACKENDS.get(record.get("mode"))
        if record.get("status") != "ok" or backend is None or record.get("workers", 1) < 2 \
                or record.get("model") in TABLES_OUTSIDE_SCOPE:
            continue
        spec, n = record["spec"], record["workers"]
        b = int(record.get("worker_batch", record.get("batch_size")))
        if record.get("dense_param_bytes") is None and record["model"] != "embedding":
            continue
        sizes = table_sizes(spec)
        dense = _dense_bytes(record["model"], spec["dim"], record.get("dense_param_bytes"), len(sizes))
        tables = expected_tables(sizes, record["model"], spec["dim"], n, b, exponent)
        step, bound = traffic_bytes(tables, n, b, backend, dense), lower_bound_bytes(tables, n, dense)
        measured = float(record["bytes_per_sample"])
        model = bytes_per_sample(step.total, n * b)
        sampled = record.get("projected_bytes_per_step")
        rows.append({"model": record["model"], "backend": backend, "workers": n, "batch_size": b,
                     "scale": spec["scale"], "dim": spec["dim"], "measured_bytes_per_sample": measured,
                     "model_bytes_per_sample": model, "error_pct": 100.0 * (model - measured) / measured,
                     "sampled_bytes_per_sample": None if sampled is None else sampled / (n * b),
                     "measured_over_lower_bound": measured / bytes_per_sample(bound, n * b)})
    return sorted(rows, key=lambda r: (r["model"], r["backend"], r["workers"], r["batch_size"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks.real_projection [--records DIR] [--out DIR]``: print the rows, write the section."""

    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_projection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flag(parser, "--worker_batch", type=int, default=1024, help="rows each worker reads per step (default 1024)")
    parser.add_argument("--dim", type=int, default=16, help="embedding width (default 16)")
    parser.add_argument("--exponent", type=float, default=DEFAULT_ZIPF,
                        help=f"power-law exponent of every table's ids (default {DEFAULT_ZIPF})")
    parser.add_argument("--records", default=None, help="a benchmark run's directory (its records/*.json calibrate)")
    parser.add_argument("--out", default=None, help="write projection_real.md, .json and the plot here")
    args = parser.parse_args(argv)
    rows = projection_rows(dim=args.dim, batch_size=args.worker_batch, exponent=args.exponent)
    records = []
    if args.records:
        for path in sorted(glob.glob(os.path.join(args.records, "records", "*.json"))):
            with open(path) as f:
                records.append(json.load(f))
    calibration = calibration_rows(records, args.exponent)
    print(f"{'dataset':<36} {'backend':<15} {'N':>5} {'bytes/sample':>13} {'lower bound':>12}")
    for row in rows:
        print(f"{row['dataset']:<36} {row['backend']:<15} {row['workers']:>5} {row['bytes_per_sample']:>13,.1f} "
              f"{row['lower_bound_per_sample']:>12,.1f}")
    for c in calibration:
        print(f"calibration {c['backend']} N={c['workers']}: measured {c['measured_bytes_per_sample']:,.1f}, "
              f"model {c['model_bytes_per_sample']:,.1f} B/sample ({c['error_pct']:+.2f}%)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "projection_real.md"), "w") as f:
            f.write(projection_section(rows, calibration, args.out))
        with open(os.path.join(args.out, "projection_real.json"), "w") as f:
            json.dump({"fabrics": [vars(fab) for fab in FABRICS], "rows": rows, "calibration": calibration}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
