"""Which GPU this worker uses, whatever started it, and the session config that pins it.

Every launcher says where a worker stands on its host in its own variables:
our launcher and ``horovodrun`` (``COLLECTIVE_LOCAL_RANK``, ``HOROVOD_LOCAL_RANK``),
Open MPI's ``mpirun`` (``OMPI_COMM_WORLD_LOCAL_RANK``), MPICH and Intel MPI
(``MPI_LOCALRANKID``), PMI (``PMI_LOCAL_RANK``), Slurm's ``srun``
(``SLURM_LOCALID``). :func:`local_rank` reads the first one set, or Horovod's
``hvd.local_rank()`` once Horovod is initialised. :func:`place` turns it into
this worker's GPU, the usual Horovod step:
``config.gpu_options.visible_device_list = str(local_rank)``, so that the
session's ``/gpu:0`` is the worker's own GPU. :func:`session_config` builds that
``ConfigProto``; every session collective makes uses it.

Nothing here imports TensorFlow at module level (the launcher uses this module).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import subprocess
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

CPU_DEVICE = "/cpu:0"
# With visible_device_list narrowed to one GPU, TensorFlow names that GPU /gpu:0 in the session.
GPU_DEVICE = "/gpu:0"
# Set when the local rank came from no launcher variable: every worker is assumed to be on one host.
ASSUMED_ONE_HOST = "rank (no local-rank variable set: one host assumed)"
HOROVOD = "hvd.local_rank()"


class TooManyWorkersError(ValueError):
    """More workers on this host than GPUs visible to them: two would share a GPU, which NCCL refuses."""


def _slurm_local_size(env: Mapping[str, str]) -> Optional[int]:
    """Tasks of this job step on this node: ``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"``) at ``SLURM_NODEID``."""
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not per_node:
        return None
    counts: List[int] = []
    for item in per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = env.get("SLURM_NODEID", "0")
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None


def _var(name: str) -> Callable[[Mapping[str, str]], Optional[str]]:
    return lambda env: env.get(name)


def _slurm_size_text(env: Mapping[str, str]) -> Optional[str]:
    size = _slurm_local_size(env)
    return str(size) if size is not None else None


# (local-rank variable, how to read the local size from the same launcher), in the order they are looked for.
# Open MPI's and MPICH's come before Slurm's: mpirun inside a Slurm allocation leaves the batch step's SLURM_LOCALID.
LOCAL_RANK_SOURCES: Tuple[Tuple[str, str, Callable[[Mapping[str, str]], Optional[str]]], ...] = (
    ("COLLECTIVE_LOCAL_RANK", "COLLECTIVE_LOCAL_SIZE", _var("COLLECTIVE_LOCAL_SIZE")),
    ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", _var("HOROVOD_LOCAL_SIZE")),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", _var("OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS", _var("MPI_LOCALNRANKS")),
    ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", _var("PMI_LOCAL_SIZE")),
    ("SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", _slurm_size_text),
)
LOCAL_RANK_VARS = tuple(rank_var for rank_var, _, _ in LOCAL_RANK_SOURCES)


@dataclasses.dataclass(frozen=True)
class LocalRank:
    """This worker's place on its host.

    Attributes:
      rank: index among the workers on this host, in ``[0, size)``.
      size: number of workers on this host.
      source: where it was read: a variable name, :data:`HOROVOD` or :data:`ASSUMED_ONE_HOST`.
    """

    rank: int
    size: int
    source: str


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; unset it or give a whole number") from None


def local_rank(env: Optional[Mapping[str, str]] = None, *, rank: int = 0, world_size: int = 1,
               horovod: Optional[Tuple[int, int]] = None) -> LocalRank:
    """This worker's local rank and local size, whatever started it.

    Args:
      env: the environment (default ``os.environ``), searched in the order of :data:`LOCAL_RANK_SOURCES`.
      rank, world_size: the global ones, used when no launcher variable is set (one host assumed).
      horovod: ``(hvd.local_rank(), hvd.local_size())`` once Horovod is initialised; it wins over the
        environment (Horovod computes it from the processes actually on this host).
    """
    if horovod is not None:
        return LocalRank(int(horovod[0]), int(horovod[1]), HOROVOD)
    env = os.environ if env is None else env
    for rank_var, size_var, read_size in LOCAL_RANK_SOURCES:
        value = env.get(rank_var)
        if value in (None, ""):
            continue
        local = _int(rank_var, value)
        size_text = read_size(env)
        size = _int(size_var, size_text) if size_text not in (None, "") else max(local + 1, 1)
        if size < 1 or not 0 <= local < size:
            raise ValueError(f"{rank_var}={local} does not fit a local size of {size} ({size_var}); "
                             "check how the workers were started")
        return LocalRank(local, size, rank_var)
    return LocalRank(rank, world_size, ASSUMED_ONE_HOST)


@functools.lru_cache(maxsize=1)
def _nvidia_smi_gpus() -> Tuple[str, ...]:
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(str(i) for i, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU "))


def visible_gpus(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else what ``nvidia-smi`` lists.

    CUDA stops reading ``CUDA_VISIBLE_DEVICES`` at ``-1``; an empty value hides every GPU.
    """
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(_nvidia_smi_gpus())
    gpus = []
    for entry in (x.strip() for x in visible.split(",")):
        if entry == "-1":
            break
        if entry:
            gpus.append(entry)
    return gpus


def gpu_source(env: Optional[Mapping[str, str]] = None) -> str:
    """Where :func:`visible_gpus` looked, for messages."""
    env = os.environ if env is None else env
    return "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else "nvidia-smi"


def too_many_workers(workers: int, gpus: Sequence[str], source: str, asked: str, fewer: str) -> str:
    """The refusal of more workers on a host than GPUs: both counts, and what to run instead.

    ``asked`` says who asked for the workers (``"-n 4"``); ``fewer`` how to ask for as many as GPUs.
    """
    return (f"{asked} asks for {workers} workers but {source} lists {len(gpus)} GPU(s) ({','.join(gpus)}), and "
            "every worker needs a GPU of its own (NCCL refuses two ranks on one GPU): "
            f"{fewer}, or set CUDA_VISIBLE_DEVICES= (empty) to run {workers} workers on CPU")


@dataclasses.dataclass(frozen=True)
class Placement:
    """This worker's GPU (or CPU) and how a session is pinned to it.

    Attributes:
      local: this worker's :class:`LocalRank`.
      gpus: the GPUs this process sees (``CUDA_VISIBLE_DEVICES`` entries or ``nvidia-smi`` indices).
      index: the position in ``gpus`` of this worker's GPU (TensorFlow's ``visible_device_list``
        entry), or None on CPU.
    """

    local: LocalRank
    gpus: Tuple[str, ...] = ()
    index: Optional[int] = None

    @property
    def gpu(self) -> Optional[str]:
        """This worker's GPU as the process's CUDA sees it (a ``CUDA_VISIBLE_DEVICES`` entry), or None."""
        return None if self.index is None else self.gpus[self.index]

    @property
    def visible_device_list(self) -> Optional[str]:
        """The ``gpu_options.visible_device_list`` that pins a session to this worker's GPU, or None on CPU."""
        return None if self.index is None else str(self.index)

    @property
    def device(self) -> str:
        """The TensorFlow device this worker's graph goes on, in a session made with :func:`session_config`.

        ``/gpu:0`` on every worker, as in Horovod's recipe: ``visible_device_list`` maps the session's
        only GPU, ``/gpu:0``, to GPU ``gpus[index]`` (local rank 1 of a host with 4 visible GPUs: the
        second one). ``/cpu:0`` without a GPU.
        """
        return CPU_DEVICE if self.index is None else GPU_DEVICE

    def describe(self) -> str:
        """One line for logs."""
        where = "cpu" if self.index is None else f"gpu {self.gpu} (visible_device_list={self.index})"
        return f"local rank {self.local.rank}/{self.local.size} from {self.local.source}: {where}"


def place(local: LocalRank, gpus: Sequence[str], source: str = "CUDA_VISIBLE_DEVICES") -> Placement:
    """This worker's GPU among the ``gpus`` its process sees (``source`` names where they were listed).

    - no GPU: the CPU;
    - exactly one GPU: that one (whoever started the worker gave each its own, as our launcher and
      ``srun --gpus-per-task=1`` do);
    - several: the one at the local rank, and more workers on the host than GPUs is refused with
      :class:`TooManyWorkersError`.
    """
    gpus = tuple(gpus)
    if not gpus:
        return Placement(local)
    if len(gpus) == 1:
        return Placement(local, gpus, 0)
    if local.size > len(gpus):
        raise TooManyWorkersError(too_many_workers(
            local.size, gpus, source, f"this host's share of the job (local size from {local.source})",
            f"start at most {len(gpus)} workers per host (-np {len(gpus)} on one host, HOST:{len(gpus)} in -H)"))
    return Placement(local, gpus, local.rank)


def placement(env: Optional[Mapping[str, str]] = None, *, rank: int = 0, world_size: int = 1,
              horovod: Optional[Tuple[int, int]] = None, gpus: Optional[Sequence[str]] = None) -> Placement:
    """:func:`place` for the worker described by ``env`` (default ``os.environ``).

    ``gpus`` overrides the GPUs :func:`visible_gpus` would list (tests pass a count this way).
    """
    env = os.environ if env is None else env
    local = local_rank(env, rank=rank, world_size=world_size, horovod=horovod)
    return place(local, visible_gpus(env) if gpus is None else gpus, gpu_source(env))


def session_config(base=None, where: Optional[Placement] = None):
    """A ``tf.compat.v1.ConfigProto`` pinned to this worker's GPU.

    Args:
      base: the user's ``ConfigProto``, copied and left unchanged (default: one with
        ``allow_soft_placement=True``).
      where: the :class:`Placement` (default :func:`placement` of this process's environment).

    Raises ``ValueError`` when ``base`` already lists other visible devices.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    where = placement() if where is None else where
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if base is not None:
        config.CopyFrom(base)
    wanted = where.visible_device_list
    if wanted is not None:
        given = config.gpu_options.visible_device_list
        if given and given != wanted:
            raise ValueError(f"the session config lists visible_device_list={given!r} but this worker's GPU is "
                             f"{wanted!r} ({where.describe()}); leave visible_device_list unset")
        config.gpu_options.visible_device_list = wanted
    return config


def pin_tensorflow(where: Placement) -> bool:
    """Shows TensorFlow only this worker's GPU by default, for sessions made without a config (and eager ops).

    Sessions given a ``ConfigProto`` take their GPUs from it: build it with :func:`session_config`.
    Returns whether TensorFlow's visible GPUs were narrowed; a no-op without GPUs. Too late once
    TensorFlow has set its GPUs up (logged as a warning).
    """
    if where.index is None:
        return False
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    physical = tf.config.list_physical_devices("GPU")
    if len(physical) != len(where.gpus):
        logger.warning("TensorFlow lists %d GPU(s) but this worker sees %s: not narrowing TensorFlow's GPUs; "
                       "sessions made with collective's session_config() are pinned (%s)",
                       len(physical), ",".join(where.gpus), where.describe())
        return False
    try:
        tf.config.set_visible_devices([physical[where.index]], "GPU")
    except RuntimeError:
        logger.warning("TensorFlow set its GPUs up before collective could pin this worker (%s): sessions made "
                       "without collective's session_config() may use another GPU", where.describe())
        return False
    return True
