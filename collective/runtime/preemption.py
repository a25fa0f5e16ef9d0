"""SIGTERM as a preemption notice: the workers finish their step, save a checkpoint together, and exit.

A preemptible VM or a cluster scheduler sends SIGTERM and, some seconds
later, SIGKILL. Training under :class:`collective.integration.session.CheckpointSaverHook`
(``MonitoredTrainingSession`` with a ``checkpoint_dir``, ``strategy.estimator``)
turns the signal into a request: after the step in flight, the workers agree
(the hook's per-step allreduce, so a signal seen by one worker stops all),
save a checkpoint of that step with :class:`collective.checkpoint.Saver`, and
exit with :data:`EXIT_CODE` (128 + SIGTERM, as a process killed by it). The
next run restores that checkpoint. ``python -m collective.launch`` forwards
SIGTERM to the workers and gives them ``COLLECTIVE_STOP_GRACE_SECONDS``
(default 60) before it kills them.

When training ends (the hook's ``end``, an Estimator's ``train`` returning)
SIGTERM gets its previous behaviour back, so a worker stopped after training
(exporting, evaluating, or idle) ends at once as SIGTERM ends a process; a
SIGTERM that arrived after the workers' last agreement ends it then, with
:data:`EXIT_CODE`, once the final checkpoint is saved.

A SIGTERM handler the program installed itself is left in place.
"""

from __future__ import annotations

import logging
import signal
import threading

logger = logging.getLogger("collective.runtime.preemption")

EXIT_CODE = 128 + signal.SIGTERM
_requested = threading.Event()
_installed = False
_previous = signal.SIG_DFL


def _on_sigterm(signum, _frame) -> None:
    _requested.set()
    logger.warning("received signal %d: saving a checkpoint after this step, then exiting with code %d",
                   signum, EXIT_CODE)


def install() -> bool:
    """Makes SIGTERM a preemption request; returns whether it now is one.

    Only the main thread can set signal handlers, and a handler the program
    set itself wins: in either case SIGTERM keeps its behaviour.
    """
    global _installed, _previous
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        logger.debug("not on the main thread: SIGTERM stays as it is")
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        logger.info("the program handles SIGTERM itself: no checkpoint on preemption")
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed, _previous = True, signal.SIG_DFL if previous is None else previous
    return True


def uninstall() -> bool:
    """Gives SIGTERM back the behaviour it had before :func:`install` (training has ended).

    Returns whether a SIGTERM arrived that no step acted on: the caller
    then saves and leaves (:func:`exit_after_save`). Does nothing off the
    main thread, or when the program replaced the handler since.
    """
    global _installed
    if not _installed or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _previous)
    _installed = False
    pending = _requested.is_set()
    _requested.clear()
    return pending


def requested() -> bool:
    """Whether this worker received SIGTERM."""
    return _requested.is_set()


def exit_after_save(checkpoint: str) -> None:
    """Leaves the program once the preemption checkpoint is saved (``SystemExit``: session hooks do not run)."""
    logger.warning("preempted: checkpoint %s saved; exiting with code %d", checkpoint, EXIT_CODE)
    raise SystemExit(EXIT_CODE)
