"""A launcher kept warm for the test session: ``python -m collective.launch`` forked from a preloaded process.

Most of a test job's CPU is start-up: every launch imports TensorFlow in the
launcher (``--preload``) before forking its workers. This server imports
the launcher and the modules it preloads once, then serves each
``run_workers`` call by forking a child that runs the launcher's ``main``
with the call's arguments, environment, working directory and output files,
exactly as ``python -m collective.launch ARGS`` would run with those modules
already imported. The child's exit code comes back over the socket.

    python tests/launch_server.py SOCKET_PATH MODULES
"""

import json
import os
import socket
import sys
import traceback

from collective.runtime import launcher, preload

_MAX_REQUEST = 1 << 22


def _serve_one(conn: socket.socket, request: dict, out_fd: int, err_fd: int) -> None:
    """In the forked child: becomes ``python -m collective.launch *request['argv']``; never returns."""
    code = 1
    try:
        launcher._die_with_launcher()  # pylint: disable=protected-access  (dies with its parent)
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (out_fd, 1), (err_fd, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        preload.fresh_process_state(request["env"])
        sys.argv = [launcher.__file__, *request["argv"]]
        sys.path[0] = request["cwd"]
        conn.sendall(f"{os.getpid()}\n".encode())
        try:
            code = launcher.main(request["argv"])
        except SystemExit as err:
            code = preload.exit_code(err)
        except BaseException:  # pylint: disable=broad-except  (as the interpreter would report it)
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        conn.sendall(f"{code}\n".encode())
    finally:
        os._exit(code)  # pylint: disable=protected-access


def main() -> None:
    path, modules = sys.argv[1], preload.parse_modules(sys.argv[2])
    launcher._die_with_launcher()  # pylint: disable=protected-access  (dies with its parent)
    preload.preload(modules)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)  # wake up to reap the launchers that have ended
    print("ready", flush=True)
    while True:
        _reap()
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        message, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 2)
        if os.fork() == 0:
            listener.close()
            _serve_one(conn, json.loads(message), *fds)
        for fd in fds:
            os.close(fd)
        conn.close()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    main()
