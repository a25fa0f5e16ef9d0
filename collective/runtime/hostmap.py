"""Which host each rank of a ``--hosts`` job runs on, as every worker can compute it before any collective.

The launcher exports the ``--hosts`` string (``COLLECTIVE_HOSTS``); horovodrun fills the hosts in order
(:func:`collective.runtime.multihost.ranks_by_host`), so every worker derives the same map from it and the
job's size. The hierarchical exchange (:mod:`collective.embedding.exchanges.hierarchical`) routes by it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Tuple

from collective.runtime import multihost

HOSTS_ENV = "COLLECTIVE_HOSTS"
# "0" keeps every exchange flat on several hosts (the benchmarks' flat runs); anything else lets the planner choose.
HIERARCHICAL_ENV = "COLLECTIVE_HIERARCHICAL"


@dataclasses.dataclass(frozen=True)
class HostMap:
    """The ranks of each host, hosts in ``--hosts`` order."""

    hosts: Tuple[Tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return sum(len(ranks) for ranks in self.hosts)

    def host_of(self, rank: int) -> int:
        """The index of the host running ``rank``."""
        for h, ranks in enumerate(self.hosts):
            if rank in ranks:
                return h
        raise ValueError(f"rank {rank} is on no host of {self.hosts}")

    def local_index(self, rank: int) -> int:
        """``rank``'s local rank: its position among its host's ranks."""
        return self.hosts[self.host_of(rank)].index(rank)

    def relays(self, rank: int) -> List[int]:
        """For each owner rank, the local rank on ``rank``'s host that relays ids to it across hosts: the owner's
        local rank modulo this host's size, so ids for one owner meet on one rank of each host."""
        local_size = len(self.hosts[self.host_of(rank)])
        return [self.local_index(owner) % local_size for owner in range(self.size)]


def from_env(size: int) -> Optional[HostMap]:
    """The map of this job (None when it was not started with ``--hosts``)."""
    hosts = os.environ.get(HOSTS_ENV)
    if not hosts:
        return None
    return HostMap(tuple(tuple(ranks) for ranks in multihost.ranks_by_host(hosts, size).values()))


def hierarchical_allowed() -> bool:
    """Whether ``COLLECTIVE_HIERARCHICAL`` leaves the choice to the planner (it is not ``0``)."""
    return os.environ.get(HIERARCHICAL_ENV, "").strip() != "0"
