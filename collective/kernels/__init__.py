"""GPU id kernels (CuPy) and the numpy references that define them.

The references are importable everywhere::

    from collective.kernels import partition, unique, HashTable, segment_combine

The CuPy versions, with the same signatures, live in
:mod:`collective.kernels.cupy_ops` and need the ``gpu`` extra and a CUDA
device; :func:`kernels_available` says whether this process can use them.
Nothing here is wired into the exchanges yet (docs/kernels.md).
"""

from __future__ import annotations

import logging
import pathlib
from typing import List

from .errors import HashTableFullError
from .reference import EMPTY_KEY, HashTable, hash_slots, partition, segment_combine, segment_combine_grad, unique
from .validation import COMBINERS

logger = logging.getLogger(__name__)

KERNEL_DIR = pathlib.Path(__file__).resolve().parent
"""Directory holding the ``.cu`` sources."""


def kernel_sources() -> List[pathlib.Path]:
    """The CUDA source files shipped with the package, sorted by name."""
    return sorted(KERNEL_DIR.glob("*.cu"))


def kernels_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception as error:  # CUDA driver missing or broken
        logger.debug("CuPy is installed but no CUDA device is usable: %s", error)
        return False


__all__ = [
    "COMBINERS",
    "EMPTY_KEY",
    "HashTable",
    "HashTableFullError",
    "KERNEL_DIR",
    "hash_slots",
    "kernel_sources",
    "kernels_available",
    "partition",
    "segment_combine",
    "segment_combine_grad",
    "unique",
]
