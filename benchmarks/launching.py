"""How every benchmark starts its workers: ``python -m collective.launch``, the workers new interpreters, or with
``preload`` forked from a launcher that imported the modules each worker imports once (``--preload``), so that
a short run's wall time is not mostly N TensorFlow imports.

Forked workers run what new interpreters would and step as fast, but a forked worker's peak RSS leaves out the
imported pages it shares with the launcher and never touches (about 200 MB here): the committed reports were
measured without it, and memory is compared only between runs started the same way.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List

from collective.runtime.preload import WORKER_MODULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_command(workers: int, module: str, *args: str, preload: bool = False) -> List[str]:
    """The command that runs ``python -m module args`` on ``workers`` local workers (forked with ``preload``)."""
    forked = ["--preload", WORKER_MODULES] if preload else []
    return [sys.executable, "-m", "collective.launch", "-n", str(workers), *forked, "-m", module, *args]


def hosts_command(hosts: str, module: str, *args: str) -> List[str]:
    """The command that runs ``python -m module args`` on the workers of ``hosts`` (``--hosts``, docs/hosts.md)."""
    return [sys.executable, "-m", "collective.launch", "--hosts", hosts, "-m", module, *args]


def worker_env(**extra: str) -> Dict[str, str]:
    """This process's environment with the repository on ``PYTHONPATH``, TensorFlow's C++ INFO lines off, and
    ``extra``."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                TF_CPP_MIN_LOG_LEVEL="2", **extra)
