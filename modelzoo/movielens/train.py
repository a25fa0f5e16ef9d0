"""Trains the MovieLens model: ``python modelzoo/movielens/train.py --help``, or on 2 workers
``python -m collective.launch -n 2 modelzoo/movielens/train.py`` (or ``-m modelzoo.movielens.train``)."""

from modelzoo.script import script_main

if __name__ == "__main__":
    script_main("modelzoo.movielens.model")
