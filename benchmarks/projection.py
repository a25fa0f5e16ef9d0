"""Exact bytes per training step for each backend at N = 1 ... 1024 workers, and a time model.

    python -m benchmarks.projection [--worker_batch 512] [--dim 16] [--json out.json]

Partitioning (``id % N``) and deduplication are deterministic, so the bytes
every worker sends in one step follow from the ids alone: this module
splits real global batches the way :mod:`benchmarks.batches` does (worker
``r`` gets the ``r``-th block of ``b`` rows) and applies the byte model of
:mod:`collective.comm` to what :mod:`collective.embedding.exchanges` send
for a lookup through an ``embedding_column`` (one id per sample and table):

- ``hb`` (grouped: one id and one vector alltoall for all tables of one
  width): every unique (table, id) of this worker that another worker owns
  is sent (8 bytes) and its vector comes back (``4*dim``, counted at the
  owner); the backward pass sends the gradients of those rows (``4*dim``).
- ``sok`` (SOK v2's ``lookup_sparse``, one per group of tables): one allgather
  of (id, sample) rows (16 bytes per id, one closing row per worker), one
  alltoall of the ``[B, sum of dims]`` partial sums to each other worker,
  and in the backward pass the alltoall of their gradients back.
- ``hvd_replicated``: the sparse gradient, values ``[unique ids, dim]``
  and int64 indices, allgathered. Tables with fewer rows than workers stay
  whole under hb and sok; ``collective.integration.training.average_gradients`` sends
  their gradient as one allreduce of ``[rows, dim + 1]`` sums and counts.
- dense variables: one ring allreduce, ``floor(2*S*(N-1)/N)`` per tensor.

The time model charges every collective call a latency and the busiest
worker's bytes a bandwidth: ``calls * latency * hops + max_bytes / bandwidth``
with ``hops = N - 1`` for alltoall (pairwise exchange) and ``ceil(log2 N)``
for allgather, reduce-scatter and allreduce (recursive doubling/halving).

:func:`traffic_bytes` holds the byte model for one step given each table's
distinct-id counts (:class:`TableTraffic`): :func:`step_bytes` counts them on
drawn batches, :mod:`benchmarks.real_projection` takes their expectations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from collective.byte_model import bytes_per_sample, cross_host_counts, sent_bytes
from collective.cli import add_flag
from collective.runtime.hostmap import HostMap

logger = logging.getLogger("benchmarks.projection")

WORKER_COUNTS = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
BACKENDS = ("hb", "sok", "hvd_replicated")
MOVIELENS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                         "ml-latest-small")


@dataclasses.dataclass(frozen=True)
class Fabric:
    """A link: one-way bandwidth per worker (bytes/s) and latency per message hop (s)."""

    name: str
    bandwidth: float
    latency: float


FABRICS = (
    Fabric("NVLink 4 (450 GB/s per GPU per direction, 3 us)", 450e9, 3e-6),
    Fabric("InfiniBand 100 Gb/s (12.5 GB/s, 5 us)", 12.5e9, 5e-6),
)


@dataclasses.dataclass
class StepBytes:
    """Bytes each worker sends in one step, and the collective calls the step makes by kind."""

    per_worker: np.ndarray
    alltoall_calls: int = 0
    other_calls: int = 0

    @property
    def total(self):
        """All workers' bytes: an int for counted bytes, a float for expected ones."""
        return self.per_worker.sum().item()


@dataclasses.dataclass
class TableTraffic:
    """One table's lookup in one step, as counts of distinct ids (exact, or expectations: floats).

    ``unique[w]``: distinct ids worker ``w`` looks up; ``remote[w]``: those of
    them another worker owns; ``incoming[w]``: distinct ``(source, id)`` pairs
    that other workers ask ``w`` (the owner) for.
    """

    vocab: int
    dim: int
    group: int
    unique: np.ndarray
    remote: np.ndarray
    incoming: np.ndarray


def _unique_per_worker(ids: np.ndarray, n: int, b: int, vocab: int):
    """(worker, id) pairs of the distinct ids each worker holds."""
    worker = np.arange(len(ids), dtype=np.int64) // b
    keys = np.unique(worker * vocab + ids)
    return keys // vocab, keys % vocab


def sampled_traffic(ids: np.ndarray, vocab: int, dim: int, group: int, n: int, batch_size: int) -> TableTraffic:
    """:class:`TableTraffic` counted on a global batch of ids (worker ``r`` holding block ``r``)."""
    worker, unique = _unique_per_worker(ids, n, batch_size, vocab)
    owner = unique % n
    remote = owner != worker
    return TableTraffic(vocab, dim, group, np.bincount(worker, minlength=n),
                        np.bincount(worker[remote], minlength=n), np.bincount(owner[remote], minlength=n))


def dense_allreduce_bytes(param_bytes: Sequence[int], n: int) -> int:
    """What ``comm.grouped_allreduce`` counts per worker for dense gradients of these sizes."""
    return sum(sent_bytes("allreduce", p, n) for p in param_bytes)


def step_bytes(ids: Sequence[np.ndarray], vocabs: Sequence[int], dim, n: int, batch_size: int,
               backend: str, dense_param_bytes: Sequence[int] = (), groups: Optional[Sequence[int]] = None) -> StepBytes:
    """Bytes each of ``n`` workers sends in one training step of a model whose tables take one id per sample.

    Args:
      ids: per table, the global batch's ids (``n * batch_size`` of them, worker
        ``r`` holding block ``r``).
      vocabs: rows of each table.
      dim: embedding width (float32), one for all tables or one per table.
      groups: per table, which coalesced lookup it is made in (one ``input_layer``
        call is one group: one exchange); default all in one.
      backend: ``hb``, ``sok`` or ``hvd_replicated``.
      dense_param_bytes: sizes of the dense (replicated, allreduced) variables.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if n == 1:
        return StepBytes(np.zeros(n, dtype=np.int64))
    dims = [int(dim)] * len(vocabs) if np.isscalar(dim) else [int(d) for d in dim]
    groups = [0] * len(vocabs) if groups is None else list(groups)
    tables = []
    for table_ids, vocab, width, group in zip(ids, vocabs, dims, groups):
        table_ids = np.asarray(table_ids, dtype=np.int64)
        if len(table_ids) != n * batch_size:
            raise ValueError(f"a table's global batch has {len(table_ids)} ids, expected {n} x {batch_size}")
        if backend == "sok" and vocab >= n:  # sok's bytes do not depend on the ids
            zero = np.zeros(n, dtype=np.int64)
            tables.append(TableTraffic(vocab, width, group, zero, zero, zero))
        else:
            tables.append(sampled_traffic(table_ids, vocab, width, group, n, batch_size))
    return traffic_bytes(tables, n, batch_size, backend, dense_param_bytes)


def traffic_bytes(tables: Sequence[TableTraffic], n: int, batch_size: int, backend: str,
                  dense_param_bytes: Sequence[int] = ()) -> StepBytes:
    """Bytes each of ``n`` workers sends in one step whose tables' lookups move ``tables`` (module docstring)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    exact = all(t.unique.dtype.kind in "iu" for t in tables)
    sent = np.zeros(n, dtype=np.int64 if exact else np.float64)
    out = StepBytes(sent)
    if n == 1:
        return out
    group_dims: Dict[int, int] = {}  # sok: summed widths of each group's sharded tables
    group_ids: Dict[int, int] = {}  # sok: ids of each group's sharded tables per worker
    hb_groups = set()  # hb: one exchange per group and width
    for t in tables:
        if backend == "hvd_replicated":
            sent += sent_bytes("allgather", t.unique * (4 * t.dim + 8), n)
            out.other_calls += 2
        elif t.vocab < n:  # left whole: its gradient's dense sums and row counts, allreduced
            sent += sent_bytes("allreduce", t.vocab * (t.dim + 1) * 4, n)
            out.other_calls += 1
        elif backend == "hb":
            sent += t.remote * (8 + 4 * t.dim) + t.incoming * 4 * t.dim
            hb_groups.add((t.group, t.dim))
        else:  # sok: one id per sample
            group_dims[t.group] = group_dims.get(t.group, 0) + t.dim
            group_ids[t.group] = group_ids.get(t.group, 0) + batch_size
    out.alltoall_calls += 3 * len(hb_groups)
    for group, width in group_dims.items():
        # (id, sample) rows plus the closing row; the partial sums out, their gradients back
        sent += sent_bytes("allgather", 16 * (group_ids[group] + 1), n) + 2 * (n - 1) * batch_size * width * 4
        out.other_calls += 1
        out.alltoall_calls += 2
    sent += dense_allreduce_bytes(dense_param_bytes, n)
    out.other_calls += 2 if dense_param_bytes else 0
    return out


def lower_bound_bytes(tables: Sequence[TableTraffic], n: int, dense_param_bytes: Sequence[int] = ()) -> float:
    """All workers' bytes of one step if every table were sharded and exchanged deduplicated.

    Each distinct id a worker needs from another owner crosses once (8 bytes)
    and its vector comes back and its gradient goes out once (``4*dim`` each):
    the unique ids per (source, owner) pair; plus the dense allreduce every
    backend pays.
    """
    if n == 1:
        return 0.0
    ids = sum(float(np.sum(t.remote)) * (8 + 8 * t.dim) for t in tables)
    return ids + n * dense_allreduce_bytes(dense_param_bytes, n)


def projected_seconds(step: StepBytes, n: int, fabric: Fabric) -> float:
    """Communication time of one step under the latency/bandwidth model (module docstring)."""
    if n == 1:
        return 0.0
    hops = step.alltoall_calls * (n - 1) + step.other_calls * math.ceil(math.log2(n))
    return hops * fabric.latency + float(step.per_worker.max()) / fabric.bandwidth



# ---------------------------------------------------------------- several hosts: two levels

@dataclasses.dataclass(frozen=True)
class HostFabric:
    """Two levels of links: ``intra`` between the workers of one host (bandwidth per worker) and ``cross``,
    each host's link to the others (bandwidth per host)."""

    name: str
    intra: Fabric
    cross: Fabric


@dataclasses.dataclass
class HostStepBytes:
    """Bytes of one step's row lookups on hosts, split by level, and the all-to-alls the exchange makes.

    ``intra[r]``: bytes rank ``r`` sends to ranks of its own host; ``cross[h]``: bytes host ``h``'s link sends
    to other hosts. ``alltoalls`` span every rank; ``host_alltoalls`` stay within each host.
    """

    intra: np.ndarray
    cross: np.ndarray
    alltoalls: int
    host_alltoalls: int


def host_step_bytes(ids_by_rank: Sequence[np.ndarray], hosts: Sequence[Sequence[int]], dim: int,
                    hierarchical: bool) -> HostStepBytes:
    """Bytes by level of one step of one hb table (``id % N`` owners) whose ranks ``hosts[h]`` run on host ``h``.

    Across hosts: :func:`collective.byte_model.cross_host_counts` (the byte model the relays are tested
    against): every id a host asks of another host sends 8 bytes and its gradient (``4*dim``) out, and its
    vector (``4*dim``) comes back. Within a host each rank's distinct ids go to the rank of its host that takes
    them (flat: the owner, where it is on this host; hierarchical: the relay,
    :meth:`collective.runtime.hostmap.HostMap.relays`), the same bytes each way; the flat exchange is one
    set of 3 all-to-alls (ids, vectors, gradients) over all ranks, the hierarchical one adds 3 within hosts.
    """
    n = sum(len(ranks) for ranks in hosts)
    where = HostMap(tuple(tuple(ranks) for ranks in hosts))
    asked, served = cross_host_counts(ids_by_rank, lambda i: np.asarray(i) % n, hosts, hierarchical)
    out, incoming = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for ranks in hosts:
        local = np.full(n, -1, np.int64)  # each owner's taker on this host, -1 where it is across hosts
        if hierarchical:
            local[:] = np.asarray(ranks)[where.relays(ranks[0])]
        else:
            local[list(ranks)] = ranks
        for r in ranks:
            taker = local[np.unique(np.asarray(ids_by_rank[r], np.int64)) % n]
            moved = taker[(taker >= 0) & (taker != r)]
            out[r] += moved.size
            incoming += np.bincount(moved, minlength=n)
    return HostStepBytes(intra=out * (8 + 4 * dim) + incoming * 4 * dim, cross=asked * (8 + 4 * dim) + served * 4 * dim,
                         alltoalls=3, host_alltoalls=3 if hierarchical else 0)


def host_projected_seconds(step: HostStepBytes, hosts: Sequence[Sequence[int]], fabric: HostFabric) -> float:
    """Communication time of one step on hosts: :func:`projected_seconds`'s model on each level.

    An all-to-all over all ranks takes ``per_host - 1`` hops within the host and ``N - per_host`` across
    (``per_host`` the largest host's ranks), one within a host ``per_host - 1``; the busiest rank's bytes within
    hosts cross at ``fabric.intra``'s bandwidth, the busiest host's bytes across hosts at ``fabric.cross``'s.
    """
    n, per_host = sum(len(ranks) for ranks in hosts), max(len(ranks) for ranks in hosts)
    if n == 1:
        return 0.0
    intra_hops = (per_host - 1) * fabric.intra.latency
    hops = step.alltoalls * (intra_hops + (n - per_host) * fabric.cross.latency) + step.host_alltoalls * intra_hops
    return (hops + float(step.intra.max()) / fabric.intra.bandwidth
            + (float(step.cross.max()) / fabric.cross.bandwidth if len(hosts) > 1 else 0.0))


# ---------------------------------------------------------------- datasets

@dataclasses.dataclass
class IdSource:
    """Draws global batches of ids from one dataset."""

    name: str
    vocabs: List[int]
    draw: object  # Callable[[int rows, int batch index], List[np.ndarray]]


def synthetic_source(scale: float, seed: int = 7) -> IdSource:
    """Criteo-shaped synthetic ids (:mod:`datasets.synthetic`), fresh rows for every batch."""
    from benchmarks.batches import synthetic_rows  # pylint: disable=import-outside-toplevel
    from datasets import schema  # pylint: disable=import-outside-toplevel
    from datasets.synthetic import cardinalities  # pylint: disable=import-outside-toplevel

    def draw(rows: int, k: int) -> List[np.ndarray]:
        columns = synthetic_rows(rows, scale, seed * 1000 + k)
        return [columns[name] for name in schema.CATEGORICAL]

    return IdSource(f"synthetic Criteo (scale {scale})", list(cardinalities(scale)), draw)


def movielens_source(path: str = MOVIELENS, seed: int = 7) -> Optional[IdSource]:
    """(user, movie) ids of MovieLens ratings at ``path``, rows drawn with replacement; None if absent."""
    if not os.path.isdir(path):
        logger.info("no MovieLens at %s: projection uses the synthetic data only", path)
        return None
    from datasets.movielens import read  # pylint: disable=import-outside-toplevel

    ratings = read(path).ratings
    users = np.unique(ratings["user"].to_numpy(), return_inverse=True)[1].astype(np.int64)
    items = np.unique(ratings["item"].to_numpy(), return_inverse=True)[1].astype(np.int64)
    vocabs = [int(users.max()) + 1, int(items.max()) + 1]

    def draw(rows: int, k: int) -> List[np.ndarray]:
        pick = np.random.default_rng([seed, k]).integers(0, len(users), rows)
        return [users[pick], items[pick]]

    return IdSource(f"MovieLens {os.path.basename(os.path.normpath(path))}", vocabs, draw)


def model_tables(model: str, vocabs: Sequence[int], dim: int):
    """(column index, vocabulary, width, lookup group) of each table of a harness model over the Criteo columns."""
    count = len(vocabs)
    if model == "deepfm":  # first-order weights (width 1) and the shared embeddings, two input_layer calls
        return list(range(count)) * 2, list(vocabs) * 2, [1] * count + [dim] * count, [0] * count + [1] * count
    if model in ("embedding", "dlrm", "dlrm_outside_scope"):
        return list(range(count)), list(vocabs), [dim] * count, [0] * count
    raise ValueError(f"the projection does not know the tables of model {model!r}")


def head_param_bytes(tables: int, dim: int, dense_features: int) -> List[int]:
    """Dense variables of the embedding-only model: the linear head's kernel and bias (float32)."""
    return [(tables * dim + dense_features) * 4, 4]


def project(source: IdSource, dim: int, batch_size: int, worker_counts: Iterable[int] = WORKER_COUNTS,
            batches: int = 2, dense_features: int = 13) -> List[Dict[str, object]]:
    """Projected bytes and times per backend and worker count, averaged over ``batches`` global batches."""
    rows = []
    params = head_param_bytes(len(source.vocabs), dim, dense_features)
    for n in worker_counts:
        draws = [source.draw(n * batch_size, k) for k in range(batches)]
        for backend in BACKENDS:
            steps = [step_bytes(ids, source.vocabs, dim, n, batch_size, backend, params) for ids in draws]
            total = float(np.mean([s.total for s in steps]))
            row = {"dataset": source.name, "backend": backend, "workers": n, "batch_size": batch_size, "dim": dim,
                   "bytes_per_step": total, "bytes_per_sample": bytes_per_sample(total, n * batch_size),
                   "max_worker_bytes": float(np.mean([s.per_worker.max() for s in steps]))}
            for fabric in FABRICS:
                row[f"seconds[{fabric.name}]"] = float(np.mean([projected_seconds(s, n, fabric) for s in steps]))
            rows.append(row)
        logger.info("projected %s at N=%d", source.name, n)
    return rows


def sources(scale: float, movielens: Optional[str] = MOVIELENS) -> List[IdSource]:
    """The synthetic source and, where the data is present, MovieLens."""
    found = [synthetic_source(scale)]
    if movielens:
        ml = movielens_source(movielens)
        if ml is not None:
            found.append(ml)
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.projection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flag(parser, "--worker_batch", type=int, default=512,
             help="rows each worker reads per step; the global batch grows as N x this (default 512)")
    parser.add_argument("--batch-size", dest="worker_batch", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--dim", type=int, default=16, help="embedding width (default 16)")
    parser.add_argument("--scale", type=float, default=0.01, help="synthetic table scale (default 0.01)")
    parser.add_argument("--batches", type=int, default=2, help="global batches averaged (default 2)")
    add_flag(parser, "--max_workers", type=int, default=1024, help="largest N (default 1024)")
    parser.add_argument("--movielens", default=MOVIELENS, help="ml-latest-small directory ('' to skip)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    counts = [n for n in WORKER_COUNTS if n <= args.max_workers]
    rows = []
    for source in sources(args.scale, args.movielens):
        rows += project(source, args.dim, args.worker_batch, counts, args.batches)
    print(f"{'dataset':<32} {'backend':<15} {'N':>5} {'bytes/sample':>13} {'IB time/step':>13}")
    for row in rows:
        print(f"{row['dataset']:<32} {row['backend']:<15} {row['workers']:>5} {row['bytes_per_sample']:>13,.1f} "
              f"{row[f'seconds[{FABRICS[1].name}]'] * 1e3:>10.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
