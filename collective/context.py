"""Where this process stands in the job: rank, sizes, device and options.

Everything is read from the environment once, when :func:`get` is first
called; the launcher (``python -m collective.launch``) and ``horovodrun`` set
the rank variables, the user sets the options. The local rank and this
worker's GPU come from :mod:`collective.runtime.devices` (any launcher's variables).
Nothing here initialises Horovod: a single process with no launcher is rank 0
of 1.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, Sequence, Tuple

from collective.runtime import devices
from collective.embedding import exchanges

KERNELS = ("tf", "cupy")

# Rank variables, in the order they are looked for: ours (set by our
# launcher), Horovod's (set by horovodrun and by our launcher), then MPI's.
# The local rank's are in collective.runtime.devices.LOCAL_RANK_SOURCES.
_RANK_VARS = ("COLLECTIVE_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_SIZE_VARS = ("COLLECTIVE_WORLD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class OptionError(ValueError):
    """An environment option holds a value collective cannot use."""


def _first_int(env: Mapping[str, str], names: tuple, default: int) -> int:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise OptionError(f"{name}={value!r} is not an integer; unset it or give a whole number") from None
    return default


def _choice(env: Mapping[str, str], name: str, choices: tuple, default: str) -> str:
    value = env.get(name, "").strip().lower() or default
    if value not in choices:
        raise OptionError(f"{name}={env.get(name)!r} is not one of {', '.join(choices)}; unset it or pick one of those")
    return value


def _backend(env: Mapping[str, str]) -> str:
    value = env.get("COLLECTIVE_STRATEGY", "").strip() or "hb"
    try:
        return exchanges.check(value, described=f"COLLECTIVE_STRATEGY={env.get('COLLECTIVE_STRATEGY')!r}")
    except exchanges.UnknownBackendError as err:
        raise OptionError(f"{err}; or unset it") from None


def _nonnegative_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = _first_int(env, (name,), default)
    if value < 0:
        raise OptionError(f"{name}={value} must be >= 0")
    return value


@dataclasses.dataclass(frozen=True)
class Context:
    """Rank, sizes, device and options of this worker process.

    Attributes:
      rank: this worker's index in ``[0, world_size)``.
      world_size: number of worker processes in the job.
      local_rank: index among the workers on this host (:func:`collective.runtime.devices.local_rank`).
      local_size: number of workers on this host.
      local_source: where ``local_rank`` was read (a variable name, or Horovod's ``hvd.local_rank()``).
      backend: the default embedding exchange (``COLLECTIVE_STRATEGY``), a name registered in
        :mod:`collective.embedding.exchanges`; ``CollectiveStrategy(backend=...)`` overrides it for its scope.
      kernels: implementation of the id kernels (``COLLECTIVE_KERNELS``): ``tf``; ``cupy`` is
        refused with an explanation until the exchanges are wired to the CuPy kernels.
      replicate_below_bytes: tables smaller than this stay replicated
        (``COLLECTIVE_REPLICATE_BELOW_BYTES``; 0 shards every table with at
        least ``world_size`` rows).
      packing: whether row-wise tables of one width share one physical variable per packing group and their
        lookups one unique, one gather and one combine (``COLLECTIVE_PACKING``: ``0``, the default, or ``1``;
        docs/packing.md).
      hb_comm_default: HybridBackend's ``HB_COMM_DEFAULT`` as given.
      hb_comm_pool_capacity: HybridBackend's ``HB_COMM_POOL_CAPACITY`` as given.
      gpus: the GPUs this process sees (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``).
      gpu_index: this worker's GPU in ``gpus`` (its ``visible_device_list``), None on CPU.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    backend: str = "hb"
    kernels: str = "tf"
    replicate_below_bytes: int = 0
    packing: bool = False
    hb_comm_default: str = "NCCL"
    hb_comm_pool_capacity: int = 1
    local_source: str = devices.ASSUMED_ONE_HOST
    gpus: Tuple[str, ...] = ()
    gpu_index: Optional[int] = None

    @property
    def placement(self) -> devices.Placement:
        """This worker's GPU and the ``visible_device_list`` that pins a session to it."""
        local = devices.LocalRank(self.local_rank, self.local_size, self.local_source)
        return devices.Placement(local, self.gpus, self.gpu_index)

    @property
    def gpu(self) -> Optional[str]:
        """This worker's GPU as its process's CUDA numbers it (a ``CUDA_VISIBLE_DEVICES`` entry), or None."""
        return self.placement.gpu

    @property
    def device(self) -> str:
        """The TensorFlow device this worker computes on, in a session made with ``session_config()``."""
        return self.placement.device

    def with_local_rank(self, local: devices.LocalRank, source: str = "CUDA_VISIBLE_DEVICES") -> "Context":
        """This context with another local rank (Horovod's, once initialised) and the GPU it implies."""
        where = devices.place(local, self.gpus, source)
        return dataclasses.replace(self, local_rank=local.rank, local_size=local.size, local_source=local.source,
                                   gpu_index=where.index)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def __repr__(self) -> str:
        gpu = f"gpu {self.gpu}" if self.gpu is not None else "cpu"
        return (f"Context(rank {self.rank}/{self.world_size}, local {self.local_rank}/{self.local_size}, "
                f"{gpu}, backend={self.backend}, kernels={self.kernels}, "
                f"replicate_below_bytes={self.replicate_below_bytes})")

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, gpus: Optional[Sequence[str]] = None) -> "Context":
        """Reads the context from ``env`` (default: ``os.environ``).

        ``gpus`` overrides the GPUs the process sees (default: :func:`collective.runtime.devices.visible_gpus`).
        Raises :class:`collective.runtime.devices.TooManyWorkersError` when this host has more workers than GPUs.
        """
        env = os.environ if env is None else env
        world_size = _first_int(env, _SIZE_VARS, 1)
        rank = _first_int(env, _RANK_VARS, 0)
        if world_size < 1 or not 0 <= rank < world_size:
            raise OptionError(f"rank {rank} does not fit world size {world_size}; "
                              "start workers with 'python -m collective.launch -n N script.py'")
        kernels = _choice(env, "COLLECTIVE_KERNELS", KERNELS, "tf")
        if kernels == "cupy":
            raise OptionError("COLLECTIVE_KERNELS='cupy': the exchanges do not run the CuPy kernels yet (the "
                              "DLPack wiring needs TensorFlow tensors on a GPU and has not been built and checked "
                              "on one); unset it or set COLLECTIVE_KERNELS=tf. The kernels themselves are in "
                              "collective.kernels.cupy_ops")
        try:
            where = devices.placement(env, rank=rank, world_size=world_size, gpus=gpus)
        except devices.TooManyWorkersError:
            raise
        except ValueError as err:
            raise OptionError(str(err)) from None
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=where.local.rank,
            local_size=where.local.size,
            local_source=where.local.source,
            gpus=where.gpus,
            gpu_index=where.index,
            backend=_backend(env),
            kernels=kernels,
            replicate_below_bytes=_nonnegative_int(env, "COLLECTIVE_REPLICATE_BELOW_BYTES", 0),
            packing=_choice(env, "COLLECTIVE_PACKING", ("0", "1"), "0") == "1",
            hb_comm_default=env.get("HB_COMM_DEFAULT", "NCCL"),
            hb_comm_pool_capacity=_first_int(env, ("HB_COMM_POOL_CAPACITY",), 1),
        )


_context: Optional[Context] = None


def get() -> Context:
    """The context of this process, read from the environment on first use."""
    global _context
    if _context is None:
        _context = Context.from_env()
    return _context


def session_config(base=None):
    """``base`` (a ``tf.compat.v1.ConfigProto``, copied) pinned to this worker's GPU (see
    :func:`collective.runtime.devices.session_config`), with :func:`rows_not_tables`. Every session
    collective makes uses it."""
    return rows_not_tables(devices.session_config(base, get().placement))


def rows_not_tables(config):
    """``config`` (changed in place and returned) with Grappler's arithmetic optimizer off, unless it sets it.

    Its ``SimplifyEmbeddingLookupStage`` rewrites TensorFlow's sparse lookup of a plain table (unique ids,
    gather, ``SparseSegmentSum``) into a read of the whole table, which the optimizer's update then copies:
    every step costs the table's size (docs/benchmarks.md). Grappler cannot turn that stage off alone.
    """
    from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=import-outside-toplevel

    options = config.graph_options.rewrite_options
    if options.arithmetic_optimization == rewriter_config_pb2.RewriterConfig.DEFAULT:
        options.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
    return config


def reset() -> None:
    """Forgets the cached context so the next :func:`get` reads the environment again."""
    global _context
    _context = None


def set(ctx: Context) -> None:  # pylint: disable=redefined-builtin
    """Replaces this process's context (``CollectiveStrategy(backend=...)`` uses it)."""
    global _context
    _context = ctx
