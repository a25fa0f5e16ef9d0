"""Hash-table vocabularies: embedding tables keyed by any int64, rows handed out on first sight.

A hash table is sharded like every table here: the owner of key ``k`` is
worker ``floormod(k, N)``. Each worker holds a values variable
``[capacity_per_worker, dim]`` and an index from key to local row.

- :mod:`.index`: the index (:class:`HashTable`: ``find``, ``find_or_insert``,
  ``entries``) and the owner side of a lookup;
- :mod:`.variable`: :func:`hash_embedding_variable` creates the values
  variable and its index and tags it as a table (:func:`table_of`);
- :mod:`.export`: the form a SavedModel serves without this package
  (:class:`ExportedTable`);
- :mod:`.lookup_mode`: training lookups insert unseen keys, lookups inside
  :func:`inference` (evaluation, prediction) give them a zero vector without
  inserting them, which is also what an exported SavedModel serves;
- :mod:`.policy`: :class:`VocabularyPolicy`, admission and eviction defined once;
  :mod:`.dynamic` carries it out (counts, counter table, eviction, row reuse);
  :mod:`.step`: the step a policy counts (the global step, moved by Keras optimizers too);
- :mod:`.growth`: a table made with ``initial_capacity_per_worker`` grows up to
  ``capacity_per_worker`` (rehashed index, per-row variables padded, slots caught up);
- :mod:`.local_variables`: per-worker variables no sharding getter touches.

A key's first vector is a function of the key alone
(:mod:`collective.embedding.key_init`), so one worker and N workers create
the same vectors.
"""

from collective.embedding.hash_table.export import ExportedTable, export_index, export_variable, exported
from collective.embedding.hash_table.index import (DEFAULT_LOAD_FACTOR, HASH_INDEX_STATE_COLLECTION, HashTable,
                                                   home_slots, is_index_state)
from collective.embedding.hash_table.policy import POLICY_KEYWORDS, VocabularyPolicy
from collective.embedding.hash_table.lookup_mode import for_mode, inference, is_training
from collective.embedding.hash_table.variable import HASH_TABLES_COLLECTION, hash_embedding_variable, table_of

__all__ = [
    "DEFAULT_LOAD_FACTOR", "HASH_INDEX_STATE_COLLECTION", "HASH_TABLES_COLLECTION",
    "HashTable", "home_slots", "is_index_state",
    "hash_embedding_variable", "table_of", "VocabularyPolicy", "POLICY_KEYWORDS",
    "ExportedTable", "export_index", "export_variable", "exported",
    "for_mode", "inference", "is_training",
]
