"""What each ``train.py`` runs: TensorFlow's logging set from ``--verbose`` before TensorFlow loads
(:mod:`collective.runtime.logs`), then :func:`modelzoo.runner.main`, which loads it."""

from __future__ import annotations

import importlib
import sys

from collective.runtime import logs


def script_main(recipe_module: str) -> None:
    """``train.py``'s ``if __name__ == "__main__"`` body: runs ``recipe_module.RECIPE`` and exits."""
    logs.configure("--verbose" in sys.argv[1:])
    from modelzoo import runner  # pylint: disable=import-outside-toplevel  (loads TensorFlow)

    sys.exit(runner.main(importlib.import_module(recipe_module).RECIPE))
