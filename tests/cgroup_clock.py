"""CPU-seconds of a whole process tree, orphans included, from a cgroup made for it.

``rusage`` counts only the processes someone waited for; a job whose workers are reparented (the launcher's
forked workers, a killed launcher's children) escapes it. A cgroup counts every process started inside it.
:func:`enter` makes one (cgroup v1 ``cpuacct`` or cgroup v2, where this process may write them: root) and moves
this process into it, so everything it starts is counted; :func:`seconds` reads it. Where no cgroup can be made,
:func:`enter` returns None and callers fall back to ``rusage``.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

ENV = "COLLECTIVE_CPU_CGROUP"  # the cgroup folder of a test run, for the per-file table (tests/timing.py)
_ROOTS = (("/sys/fs/cgroup/cpuacct", "cpuacct.usage"), ("/sys/fs/cgroup/unified", "cpu.stat"),
          ("/sys/fs/cgroup", "cpu.stat"))


def _usage_file(folder: str) -> Optional[str]:
    for name in ("cpuacct.usage", "cpu.stat"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def enter(label: str) -> Optional[Tuple[str, str]]:
    """Makes a cgroup named after ``label`` and this process and moves this process in; returns
    ``(cgroup folder, the folder it came from)``, or None where that is not possible."""
    for root, usage in _ROOTS:
        if not os.path.exists(os.path.join(root, usage)):
            continue
        folder = os.path.join(root, f"{label}-{os.getpid()}")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "cgroup.procs"), "w", encoding="ascii") as procs:
                procs.write(str(os.getpid()))
        except OSError:
            try:
                os.rmdir(folder)
            except OSError:
                pass
            continue
        return folder, root
    return None


def leave(folder: str, root: str) -> None:
    """Moves this process back to ``root`` and removes ``folder`` (once its other processes have ended)."""
    try:
        with open(os.path.join(root, "cgroup.procs"), "w", encoding="ascii") as procs:
            procs.write(str(os.getpid()))
        os.rmdir(folder)
    except OSError:
        pass


def seconds(folder: str) -> Optional[float]:
    """CPU-seconds used in the cgroup ``folder`` so far, or None if it cannot be read."""
    path = _usage_file(folder)
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as usage:
            text = usage.read()
    except OSError:
        return None
    if path.endswith("cpuacct.usage"):
        return int(text) / 1e9
    fields = dict(line.split() for line in text.splitlines() if line.strip())
    return int(fields["usage_usec"]) / 1e6
