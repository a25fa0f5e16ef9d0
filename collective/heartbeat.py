"""Progress reports from workers to ``python -m collective.launch``, which turns a stalled worker into an error.

The launcher gives each worker a file (``COLLECTIVE_HEARTBEAT_FILE``). The
worker writes one line to it, ``<phase> <steps finished> <unix time>``, when
a training step starts (``step``), when it ends (``idle``) and around work
that every worker takes part in or waits for (``save``, ``evaluate``),
which never counts as a stall. :class:`HeartbeatHook` writes the step lines;
``collective.session.MonitoredTrainingSession`` and ``strategy.estimator()``
add it. A program that trains without either sends no heartbeat, and the
launcher cannot tell a stall from slow work: Gloo's own timeout is then
the limit.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional

import tensorflow as tf

from collective.stall import ENV

_state = {"steps": 0, "phase": "idle"}


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


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Reports ``name`` (e.g. ``save``) for the duration of the block, then the phase before it."""
    before = _state["phase"]
    beat(name)
    try:
        yield
    finally:
        beat(before)


class HeartbeatHook(tf.compat.v1.train.SessionRunHook):
    """Reports each training step's start and end."""

    def before_run(self, run_context):
        beat("step")

    def after_run(self, run_context, run_values):
        beat("idle", _state["steps"] + 1)
