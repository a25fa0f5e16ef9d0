"""Every module path and file the README and docs/ name exists, and every moved path still imports with a warning."""

from __future__ import annotations

import importlib
import pathlib
import re
import sys
from typing import List, Set, Tuple

import pytest

from collective import _moved

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PACKAGES = ("collective", "modelzoo", "benchmarks", "datasets")
_DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
_FILE = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*])" % "|".join(PACKAGES))


def _named() -> Tuple[Set[str], Set[str]]:
    dotted, files = set(), set()
    for doc in DOCS:
        text = doc.read_text()
        dotted.update(m.group(1) for m in _DOTTED.finditer(text))
        files.update(m.group(1) for m in _FILE.finditer(text))
    return dotted, files


def _resolve(name: str):
    """Imports the longest module prefix of ``name`` and reads the rest as attributes; raises if neither works."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            value = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and not module_name.startswith(err.name) and err.name != module_name:
                raise
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(name)


def test_every_dotted_path_in_the_docs_imports():
    dotted, _ = _named()
    assert len(dotted) > 40, "the scan found too few paths: the pattern is broken"
    failures: List[str] = []
    for name in sorted(dotted):
        if name.startswith("datasets") and "datasets" not in sys.modules and str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))  # datasets/ is run from the checkout, never installed (DESIGN.md)
        try:
            _resolve(name)
        except Exception as err:  # pylint: disable=broad-except
            failures.append(f"{name}: {type(err).__name__}: {err}")
    assert not failures, "paths the README and docs/ name that do not resolve:\n" + "\n".join(failures)


def test_the_docs_name_new_paths_only():
    """A moved path appears only where a line says it moved."""
    stale = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for match in _DOTTED.finditer(line):
                name = match.group(1)
                old = next((o for o in _moved.MOVED if name == o or name.startswith(o + ".")), None)
                if old and not re.search(r"moved|renamed|deprecat", line, re.IGNORECASE):
                    stale.append(f"{doc.name}:{number}: {name} (now {_moved.MOVED[old]})")
    assert not stale, "\n".join(stale)


def test_every_file_path_in_the_docs_exists():
    _, files = _named()
    assert len(files) > 20, "the scan found too few files: the pattern is broken"
    missing = [f for f in sorted(files) if not (REPO / f).exists() and not (REPO / f).with_suffix(".py").exists()
               and "*" not in f and "<" not in f]
    assert not missing, f"files the README and docs/ name that do not exist: {missing}"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_a_moved_module_path_imports_as_the_new_module_with_a_deprecation_warning(old):
    new = importlib.import_module(_moved.MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=re.escape(_moved.MOVED[old])):
        module = importlib.import_module(old)
    assert module is new
