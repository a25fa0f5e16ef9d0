"""Where a worker of a multi-host test runs, for tests/test_hosts.py; a no-op unless HOST_PROBE_DIR is set.

Writes <HOST_PROBE_DIR>/rank<r>.json: the host's name and its address on the simulated hosts' bridge, the
ranks Horovod gives (global, local, cross) and the GPU collective.runtime.devices picks from the list in
HOST_PROBE_GPUS (the GPUs each host is said to have; there is no real GPU).
"""

import json
import os
import socket

import psutil

from collective.runtime import devices


def record() -> None:
    out = os.environ.get("HOST_PROBE_DIR")
    if not out:
        return
    import horovod.tensorflow as hvd

    hvd.init()
    where = devices.placement(horovod=(hvd.local_rank(), hvd.local_size()),
                              gpus=[g for g in os.environ.get("HOST_PROBE_GPUS", "").split(",") if g])
    addresses = [a.address for nic in psutil.net_if_addrs().values() for a in nic
                 if a.family == socket.AF_INET and not a.address.startswith("127.")]
    probe = {"hostname": socket.gethostname(), "addresses": addresses, "rank": hvd.rank(), "size": hvd.size(),
             "local_rank": hvd.local_rank(), "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
             "cross_size": hvd.cross_size(), "gpu": where.gpu, "visible_device_list": where.visible_device_list,
             "device": where.device, "env_local_rank": os.environ.get("HOROVOD_LOCAL_RANK")}
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w", encoding="utf-8") as f:
        json.dump(probe, f)


def record_exchange() -> None:
    """Writes <HOST_PROBE_DIR>/rank<r>.exchange.json: the hosts (their ranks) the hierarchical exchange routed
    through, null where the exchanges stayed flat."""
    out = os.environ.get("HOST_PROBE_DIR")
    if not out:
        return
    from collective import comm
    from collective.embedding.exchanges import hierarchical

    group = hierarchical.route()
    hosts = None if group is None else [list(ranks) for ranks in group.hosts.hosts]
    with open(os.path.join(out, f"rank{comm.rank()}.exchange.json"), "w", encoding="utf-8") as f:
        json.dump({"hierarchical": hosts}, f)
