"""The repository's ``datasets`` package, which the model zoo generates, converts and reads its data with.

``datasets/`` sits beside ``modelzoo/`` in the checkout and is deliberately not
installed: a top-level package named ``datasets`` would shadow Hugging Face's
library in every program of the environment. So it is importable only where
the repository root is on ``sys.path`` (``python -m ...`` from the root,
pytest), not in a ``train.py`` run by its path nor in ``python -m
collective.demo`` run from elsewhere. :func:`import_datasets` loads that one
folder from its place beside this package, without touching ``sys.path``
(nothing else of the checkout becomes importable), and gives the module that
is already loaded when there is one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DATASETS = Path(__file__).resolve().parents[1] / "datasets"
SUBPACKAGES = ("schema", "synthetic", "movielens", "criteo")


def import_datasets(module: str = "") -> ModuleType:
    """The repository's ``datasets`` package with ``schema``, ``synthetic``, ``movielens`` and ``criteo`` imported,
    or its ``module`` (``import_datasets("criteo.parse")`` is ``datasets.criteo.parse``).

    Raises ImportError when the checkout has no ``datasets/`` beside ``modelzoo/``,
    or when another package named ``datasets`` (Hugging Face's) is already imported
    in this process.
    """
    package = sys.modules.get("datasets")
    if package is None:
        init = DATASETS / "__init__.py"
        if not init.is_file():
            raise ImportError(f"the model zoo needs the repository's datasets package, which is not at {DATASETS}: "
                              "run it from a checkout of the repository (modelzoo/ and datasets/ side by side)")
        spec = importlib.util.spec_from_file_location("datasets", init, submodule_search_locations=[str(DATASETS)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["datasets"] = package  # before running it: its modules import ``datasets.schema``
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules["datasets"]
            raise
    elif Path(package.__file__ or "").resolve().parent != DATASETS:
        raise ImportError(f"the model zoo needs the repository's datasets package ({DATASETS}), but this process "
                          f"has already imported another package named datasets from {package.__file__}")
    for name in SUBPACKAGES:
        importlib.import_module(f"datasets.{name}")
    return importlib.import_module(f"datasets.{module}") if module else package
