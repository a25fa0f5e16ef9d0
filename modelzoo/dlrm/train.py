"""Trains DLRM: ``python modelzoo/dlrm/train.py --help``, or on 2 workers
``python -m collective.launch -n 2 modelzoo/dlrm/train.py`` (or ``-m modelzoo.dlrm.train``)."""

from modelzoo.script import script_main

if __name__ == "__main__":
    script_main("modelzoo.dlrm.model")
