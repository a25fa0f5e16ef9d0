"""Logging of the demo's and the model zoo's command lines: quiet TensorFlow unless ``--verbose``.

Quiet means: TensorFlow's C++ log lines below ERROR (``TF_CPP_MIN_LOG_LEVEL``
2, or higher if already set), and the ``tensorflow`` and ``absl`` Python
loggers at ERROR (deprecation notices about the TF1 API the recipes use on
purpose, "Fingerprint not found" when a SavedModel is loaded). Processes
started afterwards inherit the environment variable: the launcher passes it
to its workers. The launcher itself changes nothing, so a user's own script
under it keeps its logging.
"""

from __future__ import annotations

import logging
import os
import warnings

TF_CPP_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
QUIET_CPP_LEVEL = 2  # INFO and WARNING off, ERROR and FATAL stay
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(verbose: bool = False) -> None:
    """Logs INFO lines with time and logger name to stderr, and sets TensorFlow's logging as the module says.

    Call it before TensorFlow is imported: the C++ level is read once, at
    TensorFlow's first log line, and TensorFlow's Python logger adds a
    handler of its own when it finds none on the root logger (each of its
    lines would then show twice). ``verbose`` sets the C++ level to 0 (every
    line, also under the launcher, whose default hides INFO) and leaves the
    Python loggers alone.
    """
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    if verbose:
        os.environ[TF_CPP_LEVEL] = "0"
        return
    try:
        current = int(os.environ.get(TF_CPP_LEVEL, "0"))
    except ValueError:
        current = 0
    os.environ[TF_CPP_LEVEL] = str(max(current, QUIET_CPP_LEVEL))
    try:
        import absl.logging  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (absl's class first)
    except ImportError:  # TensorFlow brings absl; without it there is nothing of absl's to quiet
        pass
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"`tf\.layers\.\w+` is deprecated", category=UserWarning)
