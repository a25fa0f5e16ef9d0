"""Runs a command and prints its wall time and CPU-seconds, children included, as ``time`` does.

    python scripts/timed.py LABEL COMMAND [ARG...]

Exits with the command's exit code. CPU counts every process the command waited for, so a test run's
workers are in it.
"""

import resource
import subprocess
import sys
import time


def main() -> int:
    label, command = sys.argv[1], sys.argv[2:]
    start = time.monotonic()
    code = subprocess.call(command)
    wall = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print(f"{label}: {wall:.0f} s wall ({wall / 60:.1f} min), {cpu:.0f} CPU-seconds "
          f"(user {usage.ru_utime:.0f} + sys {usage.ru_stime:.0f}), children included", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
