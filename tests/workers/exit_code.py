"""Rank 1 exits with code 3; every other rank (and a child it starts) would sleep a minute."""

import os
import subprocess
import sys
import time

out_dir = sys.argv[1]
rank = int(os.environ["HOROVOD_RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.path.join(out_dir, f"pids{rank}.txt"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}\n")
if rank == 1:
    time.sleep(1.0)
    sys.exit(3)
time.sleep(60)
