"""Rank 2 exits with code 17; rank 0 fails with code 1 the moment rank 2 has ended; rank 1 would sleep a minute.

The launcher must report rank 2, whose failure came first, though rank 0 is first in rank order.
"""

import os
import sys
import time

out_dir = sys.argv[1]
rank = int(os.environ["HOROVOD_RANK"])
pid_file = os.path.join(out_dir, "rank2.pid")
if rank == 2:
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    os._exit(17)
if rank == 0:
    while not os.path.exists(pid_file):
        time.sleep(0.001)
    with open(pid_file) as f:
        stat = f"/proc/{f.read()}/stat"
    while os.path.exists(stat) and open(stat).read().split()[2] != "Z":
        time.sleep(0.0005)
    os._exit(1)
time.sleep(60)
