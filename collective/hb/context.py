"""``hb.context``: rank, world size and HybridBackend's tuning options of this worker.

``HB_COMM_DEFAULT`` and ``HB_COMM_POOL_CAPACITY`` are read (once) by
:mod:`collective.context`. collective has one communication engine, Horovod
(Gloo on CPU, NCCL on GPU, chosen by Horovod), so both are accepted, checked,
and change nothing; see docs/api_hb.md.
"""

from __future__ import annotations

import logging

from collective import context as _core

logger = logging.getLogger("collective.hb")

COMM_CHOICES = ("NCCL", "GLOO", "MPI")


class Context:
    """HybridBackend's ``hb.context``, answered from :func:`collective.context.get`."""

    @property
    def rank(self) -> int:
        return _core.get().rank

    @property
    def world_size(self) -> int:
        return _core.get().world_size

    @property
    def local_rank(self) -> int:
        return _core.get().local_rank

    @property
    def local_world_size(self) -> int:
        return _core.get().local_size

    @property
    def devices(self):
        """This worker's device, as HybridBackend lists devices."""
        return [_core.get().device]

    @property
    def is_chief(self) -> bool:
        return _core.get().is_chief

    @property
    def options(self) -> "Options":
        return Options()

    def __repr__(self) -> str:
        return f"hb.context(rank={self.rank}, world_size={self.world_size})"


class Options:
    """HybridBackend's tuning options; they are accepted and have no effect in collective."""

    @property
    def comm_default(self) -> str:
        value = _core.get().hb_comm_default.strip().upper()
        if value not in COMM_CHOICES:
            raise _core.OptionError(f"HB_COMM_DEFAULT={value!r} is not one of {', '.join(COMM_CHOICES)}; "
                                    "unset it (collective always communicates through Horovod)")
        return value

    @property
    def comm_pool_capacity(self) -> int:
        value = _core.get().hb_comm_pool_capacity
        if value < 1:
            raise _core.OptionError(f"HB_COMM_POOL_CAPACITY={value} must be >= 1; unset it (it has no effect)")
        return value


context = Context()
