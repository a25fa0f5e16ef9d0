"""How every benchmark starts its workers: ``python -m collective.launch`` with the modules each worker imports
preloaded (``--preload``), so that a run's wall time is not mostly N TensorFlow imports.

Forked workers run what new interpreters would; a run's steady-state step times do not depend on how its
workers started.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = "tensorflow,horovod.tensorflow,collective"


def launch_command(workers: int, module: str, *args: str) -> List[str]:
    """The command that runs ``python -m module args`` on ``workers`` local workers."""
    return [sys.executable, "-m", "collective.launch", "-n", str(workers), "--preload", PRELOAD, "-m", module,
            *args]


def worker_env(**extra: str) -> Dict[str, str]:
    """This process's environment with the repository on ``PYTHONPATH``, TensorFlow's C++ INFO lines off, and
    ``extra``."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                TF_CPP_MIN_LOG_LEVEL="2", **extra)
