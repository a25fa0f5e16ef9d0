"""The flag convention of every command line of the project except ``collective.launch``.

Long options are snake_case (``--batch_size``, ``--test_fraction``), as
TensorFlow's model garden, DeepRec's modelzoo and absl spell them;
``collective.launch`` follows ``horovodrun`` (``-np``, ``-H``) instead.
``--batch_size`` is always the global batch: each of N workers reads
``batch_size / N`` rows per step. Earlier kebab-case spellings
(``--test-fraction``) still parse, hidden from ``--help``.
"""

from __future__ import annotations

import argparse
from typing import Any

_NOT_FOR_ALIAS = ("help", "default", "required", "metavar", "dest")


def add_flag(container: Any, name: str, *names: str, **kwargs: Any) -> argparse.Action:
    """``container.add_argument(name, *names, **kwargs)`` (a parser, group or mutually exclusive group), plus
    the kebab-case spelling of each snake_case long option as a hidden alias with the same destination."""
    action = container.add_argument(name, *names, **kwargs)
    alias = {k: v for k, v in kwargs.items() if k not in _NOT_FOR_ALIAS}
    for option in (name, *names):
        kebab = "--" + option[2:].replace("_", "-") if option.startswith("--") else option
        if kebab != option:
            container.add_argument(kebab, dest=action.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **alias)
    return action
