"""Multi-host jobs: what ``python -m collective.launch --hosts`` hands to ``horovodrun``, and the run itself.

The launcher runs ``python -m collective.runtime.multihost HOROVODRUN_ARGS...``: Horovod 0.28.1's ``horovodrun``
(Gloo, over ssh) with three changes made here, so that ``--hosts`` works as a user types it:

- the network interface is the local one on the hosts' network (:func:`interface_for`), passed as
  ``--network-interfaces``: Horovod's own probe starts a task server on every host and every port;
- its rendezvous server listens on that interface's address only (Horovod's binds every interface, and its
  store takes unauthenticated reads and writes);
- a worker that fails is logged with its host and the ranks that host ran, an ssh that drops (exit 255) as
  the host being lost; the job's exit code is the first failed worker's;
- each worker runs under :mod:`collective.runtime.hostworker`, which ends it when its ssh session ends (when
  horovodrun stops the job, the workers on the other hosts do not outlive it).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger("collective.launch")

# ssh's own exit code when the connection fails or drops.
SSH_LOST = 255


class HostsError(ValueError):
    """A ``--hosts`` job cannot be started as asked."""


def parse_hosts(hosts: str) -> List[Tuple[str, int]]:
    """``"node1:4,node2:4"`` as ``[("node1", 4), ("node2", 4)]``; refuses entries that are not HOST:SLOTS."""
    parsed = []
    for item in hosts.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise HostsError(f"--hosts entry {item!r} is not HOST:SLOTS (e.g. node1:4,node2:4)")
        parsed.append((name, int(slots)))
    names = [name for name, _ in parsed]
    if len(set(names)) != len(names):
        raise HostsError(f"--hosts {hosts!r} names a host twice; give each host once with all its slots")
    return parsed


def ranks_by_host(hosts: str, size: int) -> Dict[str, List[int]]:
    """Which ranks each host runs, as horovodrun assigns them (hosts in order, each filled to its slots)."""
    ranks: Dict[str, List[int]] = {}
    rank = 0
    for name, slots in parse_hosts(hosts):
        take = min(slots, size - rank)
        ranks[name] = list(range(rank, rank + take))
        rank += take
    return {name: r for name, r in ranks.items() if r}


def _resolve(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError as err:
        raise HostsError(f"host {name!r} of --hosts does not resolve ({err}); add it to DNS or /etc/hosts") from None


def interface_for(names: Sequence[str],
                  interfaces: Optional[Dict[str, List[Tuple[str, str]]]] = None) -> Tuple[str, str]:
    """The local interface on the same IPv4 network as every remote host in ``names``, and its address.

    ``interfaces`` maps interface names to ``(address, netmask)`` pairs (default: this machine's, from psutil).
    Hosts that resolve to an address of this machine are skipped. Raises :class:`HostsError` when no single
    interface reaches them all (pass ``--network-interface`` then).
    """
    if interfaces is None:
        import psutil  # pylint: disable=import-outside-toplevel

        interfaces = {nic: [(a.address, a.netmask) for a in addrs if a.family == socket.AF_INET and a.netmask]
                      for nic, addrs in psutil.net_if_addrs().items()}
    local = {address for pairs in interfaces.values() for address, _ in pairs}
    remote = {name: _resolve(name) for name in names}
    remote = {name: address for name, address in remote.items() if address not in local}
    if not remote:
        raise HostsError(f"every host of --hosts ({', '.join(names)}) is this machine: run the job without --hosts "
                         "(python -m collective.launch -n N)")
    candidates = []
    for nic, pairs in sorted(interfaces.items()):
        for address, netmask in pairs:
            network = ipaddress.ip_network(f"{address}/{netmask}", strict=False)
            if network.prefixlen < 32 and all(ipaddress.ip_address(a) in network for a in remote.values()):
                candidates.append((network.prefixlen, nic, address))
    if not candidates:
        where = ", ".join(f"{name}={address}" for name, address in sorted(remote.items()))
        raise HostsError(f"no local network interface is on the network of every host ({where}); "
                         "pass --network-interface NAME (the interface the hosts reach this machine on)")
    _, nic, address = max(candidates)  # the narrowest network that holds them all
    return nic, address


def interface_address(nic: str) -> str:
    """The IPv4 address of local interface ``nic``."""
    import psutil  # pylint: disable=import-outside-toplevel

    addrs = psutil.net_if_addrs()
    if nic not in addrs:
        raise HostsError(f"--network-interface {nic!r} is not an interface of this machine "
                         f"(it has {', '.join(sorted(addrs))})")
    for addr in addrs[nic]:
        if addr.family == socket.AF_INET:
            return addr.address
    raise HostsError(f"--network-interface {nic!r} has no IPv4 address")


def command(worker: Sequence[str], size: int, hosts: str, nic: str, ssh_port: Optional[int] = None,
            ssh_identity_file: Optional[str] = None) -> List[str]:
    """The command line the launcher runs for a ``--hosts`` job (horovodrun's options, run through this module)."""
    full = [sys.executable, "-m", "collective.runtime.multihost", "--gloo", "-np", str(size), "-H", hosts,
            "--network-interfaces", nic, "--disable-cache"]
    if ssh_port is not None:
        full += ["--ssh-port", str(ssh_port)]
    if ssh_identity_file:
        if not os.path.isfile(ssh_identity_file):
            raise HostsError(f"--ssh-identity-file {ssh_identity_file!r} does not exist")
        full += ["--ssh-identity-file", os.path.abspath(ssh_identity_file)]
    # Each worker runs under collective.runtime.hostworker, which ends it when its ssh session ends.
    return full + [sys.executable, "-m", "collective.runtime.hostworker", *worker]


def _bind_rendezvous_to(address: str) -> None:
    """Makes horovodrun's rendezvous server listen on ``address`` only (Horovod's binds every interface)."""
    from horovod.runner.http import http_server  # pylint: disable=import-outside-toplevel
    from horovod.runner.util.threads import in_thread  # pylint: disable=import-outside-toplevel

    def start(self, handler_cls=http_server.RendezvousHandler):
        self._httpd = http_server.RendezvousHTTPServer((address, 0), handler_cls, self._verbose)
        self._listen_thread = in_thread(target=self._httpd.serve_forever)
        return self._httpd.server_address[1]

    http_server.RendezvousServer.start = start


def _report_failures(hosts: str, size: int, failures: List[Tuple[float, int, int]]) -> None:
    """Makes horovodrun's per-rank runner record each failure and log it with its host and the host's ranks."""
    from horovod.runner import gloo_run  # pylint: disable=import-outside-toplevel

    owners = ranks_by_host(hosts, size)
    original = gloo_run._exec_command_fn  # pylint: disable=protected-access

    def exec_command_fn(settings):
        run = original(settings)

        def run_and_report(command, slot_info, events):
            code, when = run(command, slot_info, events)
            if code != 0:
                host = slot_info.hostname
                ranks = ",".join(map(str, owners.get(host, [slot_info.rank])))
                if failures:  # horovodrun stops every other worker after the first failure
                    logger.info("rank %d on host %s ended with code %d", slot_info.rank, host, code)
                elif code == SSH_LOST:
                    logger.error("host %s lost (ranks %s): ssh to it ended with code 255 while rank %d ran: the "
                                 "host went down, its network link failed or its processes were killed",
                                 host, ranks, slot_info.rank)
                else:
                    logger.error("rank %d on host %s (ranks %s) exited with code %d", slot_info.rank, host, ranks,
                                 code)
                failures.append((time.monotonic(), slot_info.rank, code))
            return code, when

        return run_and_report

    gloo_run._exec_command_fn = exec_command_fn  # pylint: disable=protected-access


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs horovodrun with ``argv`` (its own options) with the changes of this module's docstring."""
    logging.basicConfig(level=logging.INFO, format="[launch] %(message)s")
    from horovod.runner import launch  # pylint: disable=import-outside-toplevel

    sys.argv = ["horovodrun", *(sys.argv[1:] if argv is None else argv)]
    args = launch.parse_args()
    if not args.nics or not args.hosts or not args.num_proc:
        logger.error("collective.runtime.multihost needs -np, -H and --network-interfaces (the launcher passes them)")
        return 2
    _bind_rendezvous_to(interface_address(next(iter(args.nics))))
    failures: List[Tuple[float, int, int]] = []
    _report_failures(args.hosts, args.num_proc, failures)
    try:
        launch._run(args)  # pylint: disable=protected-access
    except RuntimeError as err:
        if not failures:
            logger.error("%s", err)
            return 1
    if failures:
        _, rank, code = min(failures)
        logger.error("the job failed: rank %d first (exit code %d); horovodrun stopped the others", rank, code)
        return code if 0 < code < 256 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
