"""A checkpoint read by variable name, whether it was written by name or by object.

Graph programs (``tf.compat.v1.train.Saver``, :class:`collective.checkpoint.Saver`)
write each tensor under its variable's name; a sharded hash table's keys go
under ``<table>/keys``. TF2 programs (``tf.train.Checkpoint``,
``model.save_weights``) write by object path
(``model/out_layer/kernel/.ATTRIBUTES/VARIABLE_VALUE``); a SOK table's whole
logical table and its keys go under ``.../.ATTRIBUTES/VARIABLE_VALUE`` and
``.../.ATTRIBUTES/keys`` (:mod:`collective.sok.checkpoint`). The checkpoint's
object graph records, for every tensor, the name its variable had when saved
(``full_name``). :class:`CheckpointNames` maps those names, in the vocabulary
of name-based checkpoints (``name`` for a variable's value, ``name/<attribute>``
for another of its tensors, so ``<table>/keys``), to the checkpoint's keys,
as TensorFlow's ``Saver.restore`` does for plain variables
(``object_graph_key_mapping``, which keeps one key per name and so loses
either a SOK table's values or its keys).
"""

from __future__ import annotations

from typing import Dict, List, Mapping

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE_ATTRIBUTE = "VARIABLE_VALUE"


class CheckpointNames:
    """The tensors of checkpoint ``path`` by variable name (its own keys for a name-based checkpoint)."""

    def __init__(self, path: str):
        self.path = path
        self._reader = tf.compat.v1.train.NewCheckpointReader(path)
        self.object_based = self._reader.has_tensor(OBJECT_GRAPH_KEY)
        stored = self._reader.get_variable_to_shape_map()
        self._keys = _names_to_keys(self._reader) if self.object_based else {k: k for k in stored}
        self._ambiguous = _ambiguous_names(self._reader) if self.object_based else {}
        self.shapes: Dict[str, List[int]] = {name: stored[key] for name, key in self._keys.items() if key in stored}

    def key(self, name: str) -> str:
        """The checkpoint key holding ``name``; ``KeyError`` naming the file when it holds none."""
        if name in self._ambiguous:
            raise ValueError(f"checkpoint {self.path}: several objects were saved under the variable name '{name}' "
                             f"({', '.join(self._ambiguous[name])}), so it cannot be read by name; give those "
                             "variables distinct names")
        if name not in self._keys:
            raise KeyError(f"checkpoint {self.path} holds no tensor for '{name}'")
        return self._keys[name]

    def has_tensor(self, name: str) -> bool:
        return name in self._keys and self._reader.has_tensor(self._keys[name])

    def get_tensor(self, name: str):
        return self._reader.get_tensor(self.key(name))

    def variable_keys(self, variables) -> Mapping[str, tf.Variable]:
        """``{checkpoint key: variable}`` for a ``Saver`` restoring ``variables`` (each by its op's name)."""
        return {self.key(v.op.name): v for v in variables}


def _attributes(reader):
    """``(name, checkpoint key)`` of every tensor of an object-based checkpoint, by its variable's saved name."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    for node in graph.nodes:
        for attribute in node.attributes:
            if not attribute.full_name:
                continue
            name = attribute.full_name if attribute.name == VALUE_ATTRIBUTE \
                else f"{attribute.full_name}/{attribute.name}"
            yield name, attribute.checkpoint_key


def _names_to_keys(reader) -> Dict[str, str]:
    return {name: key for name, key in _attributes(reader)}


def _ambiguous_names(reader) -> Dict[str, List[str]]:
    """Names that several checkpoint keys were saved under (eager variables' names need not be unique)."""
    keys: Dict[str, set] = {}
    for name, key in _attributes(reader):
        keys.setdefault(name, set()).add(key)
    return {name: sorted(found) for name, found in keys.items() if len(found) > 1}
