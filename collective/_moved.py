"""Module paths that moved: each still imports, as the module it moved to, with a ``DeprecationWarning``.

Users copy recipes from older docs (``import collective.feature_column``,
``from collective.integration.training import ...``); :data:`MOVED` maps each old path
to the new one. :class:`MovedModules`, put on ``sys.meta_path`` when
``collective`` is imported, resolves an old path to the very module object
of the new one, so both names share one module and its state.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Dict

MOVED: Dict[str, str] = {
    "collective.feature_column": "collective.hash_embedding_column",  # renamed in the second wave
    "collective.lookups": "collective.integration.lookups",
    "collective.column_lookups": "collective.integration.column_lookups",
    "collective.training": "collective.integration.training",
    "collective.session": "collective.integration.session",
    "collective.estimator": "collective.integration.estimator",
    "collective.export": "collective.integration.export",
    "collective.hooks": "collective.integration.hooks",
    "collective.sync": "collective.integration.sync",
    "collective.stall": "collective.runtime.stall",
    "collective.heartbeat": "collective.runtime.heartbeat",
    "collective.preemption": "collective.runtime.preemption",
    "collective.devices": "collective.runtime.devices",
    "collective.logs": "collective.runtime.logs",
    "collective.progress": "collective.cli.progress",
    "collective.plots": "collective.cli.plots",
    "collective.modes": "collective.embedding.modes",
}


def _caller_level() -> int:
    """The ``stacklevel`` that names the code doing the import, past the import machinery and this module."""
    level, frame = 1, sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED` and loads each as the module it moved to."""

    def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import {new} instead", DeprecationWarning,
                      stacklevel=_caller_level())
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The module was executed under its new name."""


def install() -> None:
    """Puts :class:`MovedModules` on ``sys.meta_path`` once."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
