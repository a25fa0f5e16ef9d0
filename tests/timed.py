"""Runs a command and prints its wall time and CPU-seconds, every process it starts included, as ``time`` does.

    python tests/timed.py LABEL COMMAND [ARG...]

Exits with the command's exit code. CPU is read from a cgroup made for the command (root: every process it
starts, orphans included; its folder is passed on in ``COLLECTIVE_CPU_CGROUP`` for the per-file table of
tests/timing.py); elsewhere from ``rusage`` (the processes the command waited for).
"""

import os
import resource
import subprocess
import sys
import time

import cgroup_clock


def main() -> int:
    label, command = sys.argv[1], sys.argv[2:]
    cgroup = cgroup_clock.enter("collective-test")
    env = dict(os.environ, **({cgroup_clock.ENV: cgroup[0]} if cgroup else {}))
    start = time.monotonic()
    code = subprocess.call(command, env=env)
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = f"user {usage.ru_utime:.0f} + sys {usage.ru_stime:.0f} in the processes waited for"
    total = cgroup_clock.seconds(cgroup[0]) if cgroup else None
    if cgroup:
        cgroup_clock.leave(*cgroup)
    cpu = f"{total:.0f} CPU-seconds, every process included ({waited})" if total is not None else \
        f"{usage.ru_utime + usage.ru_stime:.0f} CPU-seconds ({waited})"
    print(f"{label}: {wall:.0f} s wall ({wall / 60:.1f} min), {cpu}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
