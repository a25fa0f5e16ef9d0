"""Runs a worker script as ``python script args`` does, then leaves without tearing the interpreter down.

``python -m collective.launch -n N tests/fast_exit.py SCRIPT ARGS...``: the
script runs as ``__main__`` with its own ``sys.argv`` and ``sys.path[0]``;
uncaught exceptions print their traceback and exit 1, ``sys.exit`` keeps its
code, and the ``atexit`` handlers run (Horovod's shutdown among them). Then
``os._exit`` skips the module teardown, which costs a TensorFlow process about
a third of its import time: seconds per worker in a suite of short jobs.
"""

import atexit
import os
import runpy
import sys
import traceback


def _exit_code(err: SystemExit) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as err:
        code = _exit_code(err)
    except BaseException:  # pylint: disable=broad-except  (as the interpreter reports it)
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # pylint: disable=protected-access
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # pylint: disable=broad-except
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
