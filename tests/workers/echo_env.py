"""Prints the environment the launcher gave this worker."""

import os

keys = ("HOROVOD_RANK", "HOROVOD_SIZE", "COLLECTIVE_STRATEGY", "CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS")
print(" ".join(f"{k}={os.environ.get(k, '')}" for k in keys))
