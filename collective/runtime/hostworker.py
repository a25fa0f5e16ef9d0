"""One worker of a ``--hosts`` job on its host: ``python -m collective.runtime.hostworker COMMAND...``.

horovodrun starts each worker over ssh and, when a worker fails, stops the others by killing their ssh
clients on the launching machine; without a terminal the remote sshd then leaves the worker running (it
waits in its next collective for a peer that is gone, until Gloo's timeout). This wrapper runs the worker
as its child, which the kernel kills if the wrapper dies, and ends it (SIGTERM, then SIGKILL) as soon as
the ssh session that started the wrapper has gone: its parent changes. The worker's exit code is returned.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import List, Optional, Sequence

logger = logging.getLogger("collective.launch")

_POLL_SECONDS = 0.5
_GRACE_SECONDS = 5.0


def _die_with_parent() -> None:
    """Runs in the worker before exec: the kernel kills it if this wrapper dies (Linux)."""
    try:
        import ctypes  # pylint: disable=import-outside-toplevel

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(worker: subprocess.Popen) -> None:
    worker.terminate()
    try:
        worker.wait(timeout=_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def run(command: Sequence[str], poll: float = _POLL_SECONDS) -> int:
    """Runs ``command`` until it exits or this process's parent (the ssh session) goes; returns its exit code."""
    parent = os.getppid()
    worker = subprocess.Popen(list(command), preexec_fn=_die_with_parent)

    def forward(signum, _frame):
        worker.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            code = worker.wait(timeout=poll)
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            logger.error("the ssh session of this worker ended (its launcher stopped the job or lost this host): "
                         "stopping the worker")
            _stop(worker)
            return 1


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[hostworker] %(message)s")
    command = sys.argv[1:] if argv is None else argv
    if not command:
        logger.error("usage: python -m collective.runtime.hostworker COMMAND [ARGS...]")
        return 2
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
