"""Progress bars (tqdm) that read well on a terminal and through a pipe alike.

On a terminal a bar redraws itself in place. Anywhere else (a pipe, a log
file, a worker under ``collective.launch``, whose output the launcher relays
line by line behind the rank) redraws would pile up as carriage returns in one
line that shows only at the end; there each redraw is written as a line of its
own, at most every ``COLLECTIVE_PROGRESS_SECONDS`` seconds (default 10), and
the last state always. Nothing is written before the first interval has passed
or the work is done, so a short job prints one line.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO

from tqdm import tqdm

ENV = "COLLECTIVE_PROGRESS_SECONDS"
PIPE_SECONDS = 10.0


def pipe_seconds() -> float:
    """Seconds between two lines of a bar that is not on a terminal: ``COLLECTIVE_PROGRESS_SECONDS``, else 10."""
    value = os.environ.get(ENV, "")
    try:
        return max(0.0, float(value)) if value.strip() else PIPE_SECONDS
    except ValueError:
        raise ValueError(f"{ENV}={value!r} is not a number of seconds") from None


def on_terminal(file: Optional[TextIO] = None) -> bool:
    """Whether a bar on ``file`` (default stderr) redraws in place, rather than writing lines."""
    return (sys.stderr if file is None else file).isatty()


class _Lines:
    """A stream for tqdm that writes each redraw as a line of its own."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").rstrip()
        if text:
            self._stream.write(text + "\n")

    def flush(self) -> None:
        self._stream.flush()


class _PipeBar(tqdm):
    """One line per state shown: the state at ``close`` is not written again, nor the empty start."""

    def display(self, msg=None, pos=None):  # pylint: disable=arguments-differ
        if self.n == 0 or self.n == getattr(self, "_shown_n", None):
            return True
        self._shown_n = self.n  # pylint: disable=attribute-defined-outside-init
        return super().display(msg, pos)


def bar(total: Optional[float], desc: str, unit: str = "it", *, seconds: Optional[float] = None,
        disable: bool = False, file: Optional[TextIO] = None, **kwargs) -> tqdm:
    """A tqdm bar on ``file`` (default stderr) as the module describes.

    Args:
      total: the number of units the work has.
      desc: what is done (``train``, ``generating train``).
      unit: what one unit is.
      seconds: off a terminal, the least time between two lines (default :func:`pipe_seconds`); 0 writes
        a line at every update, for callers that update only when they want a line.
      disable: no output at all.
      kwargs: passed to tqdm (``unit_scale``, ``postfix`` ...).
    """
    stream = sys.stderr if file is None else file
    if disable:
        return tqdm(total=total, desc=desc, unit=unit, disable=True, file=stream, **kwargs)
    if on_terminal(stream):
        return tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, **kwargs)
    interval = pipe_seconds() if seconds is None else seconds
    return _PipeBar(total=total, desc=desc, unit=unit, file=_Lines(stream), ascii=True, ncols=100,
                    mininterval=interval, miniters=1 if interval == 0 else None, delay=0, **kwargs)
