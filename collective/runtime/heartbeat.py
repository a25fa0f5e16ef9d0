"""Progress reports from workers to ``python -m collective.launch``, which turns a stalled worker into an error.

The launcher gives each worker a file (``COLLECTIVE_HEARTBEAT_FILE``). The
worker writes one line to it, ``<phase> <steps finished> <unix time>``, when
a training step starts (``step``), when it ends (``idle``) and around work
that every worker takes part in or waits for (``save``, ``evaluate``,
``export``), which never counts as a stall. :class:`HeartbeatHook` writes the
step lines; ``collective.integration.session.MonitoredTrainingSession`` and
``strategy.estimator()`` add it. A program that trains without either sends
no heartbeat (a save or an export there leaves none behind), and the launcher
cannot tell a stall from slow work: Gloo's own timeout is then the limit.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional

import tensorflow as tf

from collective.runtime.stall import ENV

_state: dict = {"steps": 0, "phase": None}  # phase None: no report yet


def _path() -> Optional[str]:
    return os.environ.get(ENV) or None


def beat(phase: str, steps: Optional[int] = None) -> None:
    """Reports ``phase`` after ``steps`` finished steps (default: the count so far) to the launcher, if any."""
    path = _path()
    if steps is not None:
        _state["steps"] = steps
    _state["phase"] = phase
    if path is None:
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{phase} {_state['steps']} {time.time():.3f}\n")


def _clear() -> None:
    """Takes the report back: the launcher sees no heartbeat from this worker, as before the first one."""
    _state["phase"] = None
    path = _path()
    if path is not None:
        with open(path, "w", encoding="utf-8"):
            pass


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Reports ``name`` (e.g. ``save``) for the duration of the block, then the phase before it (if any)."""
    before = _state["phase"]
    beat(name)
    try:
        yield
    finally:
        if before is None:
            _clear()
        else:
            beat(before)


class HeartbeatHook(tf.compat.v1.train.SessionRunHook):
    """Reports each training step's start and end (and ``idle`` from session creation on)."""

    def begin(self):
        if _state["phase"] is None:
            beat("idle")

    def before_run(self, run_context):
        beat("step")

    def after_run(self, run_context, run_values):
        beat("idle", _state["steps"] + 1)
