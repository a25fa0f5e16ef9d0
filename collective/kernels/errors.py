"""Errors shared by the numpy references and the CuPy kernels."""

from __future__ import annotations


class HashTableFullError(RuntimeError):
    """An insert would put more keys in a hash table than its capacity allows."""

    def __init__(self, capacity: int, size: int, new_keys: int) -> None:
        self.capacity = capacity
        self.size = size
        self.new_keys = new_keys
        needed = size + new_keys
        super().__init__(
            f"hash table is full: capacity {capacity} rows, {size} in use, and this batch "
            f"adds {new_keys} new keys ({needed} needed); raise the table's capacity "
            f"(e.g. HashTable(capacity={max(2 * capacity, needed)}))"
        )
