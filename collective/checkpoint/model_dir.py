"""Checks on a model directory and on a checkpoint against the model being built.

A checkpoint is compared by logical shapes: a sharded table is checked as
its whole ``[vocab, dim]`` table whatever the world size, so a model_dir
written by a different model (other table sizes) fails before training
starts, naming the variable and both shapes.
"""

from __future__ import annotations

import os
import uuid
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import tensorflow as tf

from collective.embedding import packed_tables
from collective.embedding.hash_table import HASH_INDEX_STATE_COLLECTION
from collective.embedding.table import shard_of
from collective.tf_internals import all_saveable_objects, saveable_object_util

Shape = Tuple[Optional[int], ...]


class ModelDirError(ValueError):
    """The model directory cannot be used (it cannot be created or written)."""


class CheckpointMismatchError(ValueError):
    """A checkpoint does not hold the variables of the model being built."""


def checkpoint_key(var, names: Optional[Mapping[int, str]] = None) -> str:
    """The name a variable is saved under: its key in a ``{name: variable}`` var_list (``names``, by ``id``),
    else what ``tf.compat.v1.train.Saver`` uses."""
    if names and id(var) in names:
        return names[id(var)]
    return var.op.name if hasattr(var, "op") else var.name


def sharded_names(var_list) -> Dict[int, str]:
    """The names a ``{name: variable}`` var_list gives its sharded tables (by ``id``); empty for a list."""
    if not isinstance(var_list, Mapping):
        return {}
    renamed_hash = [name for name, var in var_list.items() if shard_of(var) is not None
                    and shard_of(var).hash_index is not None and name != checkpoint_key(var)]
    if renamed_hash:
        raise ValueError(f"checkpoint names other than the variable's are not supported for hash-table vocabularies "
                         f"({', '.join(sorted(renamed_hash))}); save them under their own names")
    return {id(var): name for name, var in var_list.items() if shard_of(var) is not None}


def _slice_full_shape(slice_spec: str) -> Shape:
    return tuple(int(d) for d in slice_spec.split(" ")[:-1])


def model_shapes(sharded: Iterable, saveables: Iterable, names: Optional[Mapping[int, str]] = None) -> Dict[str, Shape]:
    """Logical shape of every key the model saves; ``None`` marks a size only the checkpoint knows."""
    shapes: Dict[str, Shape] = {}
    for var in sharded:
        info = shard_of(var)
        rows = None if info.hash_index is not None else info.vocab
        shapes[checkpoint_key(var, names)] = (rows, info.dim)
    for saveable in saveables:
        for spec in saveable.specs:
            if spec.slice_spec:
                shapes[spec.name] = _slice_full_shape(spec.slice_spec)
            else:
                tensor = spec.tensor
                shapes[spec.name] = tuple(tensor.shape.as_list()) if tensor.shape.rank is not None else None
    return shapes


def model_saveables() -> List:
    """Every saveable of the default graph a default Saver saves, packed tables never looked up included (their
    groups sealed now)."""
    packed_tables.seal_pending()
    return all_saveable_objects()


def split_var_list(var_list=None):
    """``(sharded variables, saveables of everything else)`` for ``var_list`` (default: all saveables)."""
    if var_list is None:
        var_list = model_saveables()
    if isinstance(var_list, Mapping):
        items = packed_tables.expand_mapping(var_list)
    else:
        items = [(None, v) for v in packed_tables.expand_for_saving(list(var_list))]
    index_state = {id(v) for v in tf.compat.v1.get_collection(HASH_INDEX_STATE_COLLECTION)}
    items = [(k, v) for k, v in items if id(v) not in index_state]  # rebuilt from the stored keys
    sharded = [v for _, v in items if shard_of(v) is not None]
    rest = [(k, v) for k, v in items if shard_of(v) is None]
    if not rest:
        return sharded, []
    if rest[0][0] is not None:
        names_to_saveables = dict(rest)
    else:
        names_to_saveables = saveable_object_util.op_list_to_dict([v for _, v in rest])
    return sharded, saveable_object_util.validate_and_slice_inputs(names_to_saveables)


def check_shapes(expected: Mapping[str, Shape], checkpoint_path: str,
                 found: Optional[Mapping[str, list]] = None) -> Dict[str, list]:
    """Raises :class:`CheckpointMismatchError` unless the checkpoint holds every key with its shape.

    ``found``: the checkpoint's shapes by name when they are not its keys' (an object-based checkpoint read by
    name, :class:`collective.checkpoint.object_names.CheckpointNames`). Returns the checkpoint's shape map.
    """
    if found is None:
        found = tf.compat.v1.train.NewCheckpointReader(checkpoint_path).get_variable_to_shape_map()
    # Hash tables (unknown row count) may be absent: no worker held a key.
    missing = sorted(k for k in expected if k not in found and not (expected[k] and expected[k][0] is None))
    for key in sorted(expected):
        want, have = expected[key], found.get(key)
        if have is None or want is None:
            continue
        if len(want) != len(have) or any(w is not None and w != h for w, h in zip(want, have)):
            raise CheckpointMismatchError(
                f"checkpoint {checkpoint_path} was written by a different model: variable '{key}' has shape "
                f"{_fmt(want)} in this model but {_fmt(tuple(have))} in the checkpoint. Use a new model_dir "
                "for this model, or build the model with the shapes it was trained with.")
    if missing:
        raise CheckpointMismatchError(
            f"checkpoint {checkpoint_path} was written by a different model: it lacks "
            f"{len(missing)} variable(s) of this model: {', '.join(missing[:10])}. Use a new model_dir for "
            "this model.")
    return found


def _fmt(shape: Shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def check_model_dir(model_dir: str, var_list=None) -> Optional[str]:
    """Fails early on a model_dir training cannot use; returns its latest checkpoint (or None).

    Checks that ``model_dir`` can be created and written (a small file is
    written and removed), then, when it holds a checkpoint and the model's
    variables exist (``var_list``, default: every saveable object of the
    default graph), that the checkpoint holds them with the same logical
    shapes. Every worker may call it: nothing collective runs.

    Raises:
      ModelDirError: the directory cannot be created or written.
      CheckpointMismatchError: its checkpoint belongs to a different model
        (names the variable and both shapes).
    """
    model_dir = os.fspath(model_dir)
    try:
        tf.io.gfile.makedirs(model_dir)
        probe = os.path.join(model_dir, f".collective-write-test-{uuid.uuid4().hex}")
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("ok")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as err:
        raise ModelDirError(f"model_dir {model_dir!r} is not writable ({type(err).__name__}: "
                            f"{getattr(err, 'message', err)}); pass a directory this user can create and "
                            "write") from err
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
        return None
    if var_list is None and not tf.executing_eagerly():
        var_list = model_saveables()
    if var_list:
        sharded, saveables = split_var_list(var_list)
        check_shapes(model_shapes(sharded, saveables, sharded_names(var_list)), latest)
    return latest
