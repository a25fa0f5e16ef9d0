"""Writes serving_update_cases' chain, reference and SavedModel versions on N workers (hb).

argv: out_dir. Rank 0 writes <out>/versions.json ({name: SavedModel folder}).
"""

import sys
import time

import serving_update_cases as suc
from collective import CollectiveStrategy

began = time.monotonic()
strategy = CollectiveStrategy("hb")
suc.write_versions(strategy, sys.argv[1])
print(f"rank {strategy.rank()} done in {time.monotonic() - began:.1f} s", flush=True)
