"""Trains DLRM: ``python modelzoo/dlrm/train.py --help``, or on 2 workers
``python -m collective.launch -n 2 modelzoo/dlrm/train.py``."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, when run as a script
    from modelzoo.script import script_main

    script_main("modelzoo.dlrm.model")
