"""Trains DeepFM: ``python modelzoo/deepfm/train.py --help``, or on 2 workers
``python -m collective.launch -n 2 modelzoo/deepfm/train.py`` (or ``-m modelzoo.deepfm.train``)."""

from modelzoo.script import script_main

if __name__ == "__main__":
    script_main("modelzoo.deepfm.model")
