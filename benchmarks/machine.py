"""What a benchmark ran on: CPU model, cores, GPUs, load and library versions."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any, Dict, List

# Library -> the distributions that may provide it.
_LIBRARIES = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-intel"), "horovod": ("horovod",),
              "numpy": ("numpy",), "pandas": ("pandas",), "pyarrow": ("pyarrow",)}


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpus() -> List[str]:
    """``nvidia-smi -L`` lines, or an empty list where there is no NVIDIA GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def _version(distributions) -> str:
    from importlib.metadata import PackageNotFoundError, version  # pylint: disable=import-outside-toplevel

    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "not installed"


def _git_commit() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def describe() -> Dict[str, Any]:
    """This machine and software, as a JSON-ready dict."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count() or 1,
        "usable_cores": usable,
        "gpus": gpus(),
        "load_average": load,
        "hostname": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": {name: _version(dists) for name, dists in _LIBRARIES.items()},
        "collective_commit": _git_commit(),
    }
