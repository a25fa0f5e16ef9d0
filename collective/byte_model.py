"""What one worker sends per collective call: the one byte model of the wire.

With ``N`` workers and ``S`` the bytes of the local input (an int, a numpy
integer or an int64 tensor):

=============  ==========================================================
alltoall       the rows sent to other workers (exact, from the splits)
allgather      ``S * (N - 1)``: every other worker gets the local rows
allreduce      ``2 * S * (N - 1) / N``: ring reduce-scatter + allgather
broadcast      ``S * (N - 1)`` on the root, 0 elsewhere
=============  ==========================================================

``collective.comm`` counts every call with it; hooks and the benchmarks'
projection use the same functions, so measured and projected bytes agree.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np

_FACTORS = {  # op -> (numerator, denominator) as functions of N
    "allgather": (lambda n: n - 1, lambda n: 1),
    "allreduce": (lambda n: 2 * (n - 1), lambda n: n),
    "broadcast": (lambda n: n - 1, lambda n: 1),
}


def sent_bytes(op: str, nbytes: Any, world_size: int) -> Any:
    """Bytes one worker sends for ``op`` on ``nbytes`` of local input (the root's share for ``broadcast``)."""
    if op not in _FACTORS:
        raise ValueError(f"no byte model for {op!r}; known: {', '.join(_FACTORS)} (alltoall counts its splits)")
    numerator, denominator = _FACTORS[op]
    return nbytes * numerator(world_size) // denominator(world_size)


def bytes_per_sample(sent_by_all_workers: float, global_samples: float) -> float:
    """The one meaning of ``bytes_per_sample`` (engines, :class:`collective.integration.hooks.ThroughputHook`, benchmarks):
    the bytes all workers sent over some training steps (their counters summed, measuring collectives left
    out) divided by the samples of the global batches of those steps; NaN without samples."""
    return float(sent_by_all_workers) / global_samples if global_samples else float("nan")


def cross_host_counts(ids_by_rank: Sequence[Any], owner: Callable[[np.ndarray], np.ndarray],
                      hosts: Sequence[Sequence[int]], hierarchical: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Per host, ``(asked, served)`` of one row lookup step: ``asked[h]`` ids host ``h`` sends to other hosts
    (each brings a vector back, and its gradient goes out again), ``served[h]`` ids other hosts send to ``h``
    (its ranks own them). Arguments as :func:`cross_host_ids`, which is ``asked.sum()``."""
    host_of = np.zeros(sum(len(ranks) for ranks in hosts), np.int64)
    for h, ranks in enumerate(hosts):
        host_of[list(ranks)] = h
    groups = [list(ranks) for ranks in hosts] if hierarchical else [[r] for r in range(len(host_of))]
    asked = np.zeros(len(hosts), np.int64)
    served = np.zeros(len(hosts), np.int64)
    for ranks in groups:
        wanted = np.unique(np.concatenate([np.asarray(ids_by_rank[r], np.int64).reshape(-1) for r in ranks]))
        owning = host_of[np.asarray(owner(wanted), np.int64)]
        remote = owning[owning != host_of[ranks[0]]]
        asked[host_of[ranks[0]]] += remote.size
        served += np.bincount(remote, minlength=len(hosts))
    return asked, served


def cross_host_ids(ids_by_rank: Sequence[Any], owner: Callable[[np.ndarray], np.ndarray],
                   hosts: Sequence[Sequence[int]], hierarchical: bool) -> int:
    """Ids one row lookup step sends across hosts (each brings a vector back, and its gradient goes out again).

    ``ids_by_rank``: the ids each rank looks up; ``owner``: the rank holding each id; ``hosts``: each host's
    ranks. Flat (one all-to-all over all ranks, each rank's ids deduplicated): every rank's distinct ids
    held on another host. Hierarchical (:mod:`collective.embedding.exchanges.hierarchical`): every host's
    distinct ids held on another host, once per host.
    """
    return int(cross_host_counts(ids_by_rank, owner, hosts, hierarchical)[0].sum())
