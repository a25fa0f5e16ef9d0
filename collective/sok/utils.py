"""``sok.split_embedding_variable_from_others`` and ``sok.OptimizerScope``."""

from __future__ import annotations

from typing import Iterable, Sequence, Tuple

from collective.embedding.table import shard_of


def split_embedding_variable_from_others(variables: Iterable) -> Tuple[tuple, tuple]:
    """Splits ``variables`` into (embedding variables of SOK layers, all others), keeping order."""
    variables = list(variables)
    embedding = tuple(v for v in variables if shard_of(v) is not None)
    others = tuple(v for v in variables if shard_of(v) is None)
    return embedding, others


class OptimizerScope:
    """``with sok.OptimizerScope(emb_vars): opt.apply_gradients(...)`` for TensorFlow's own optimizers.

    In SOK it makes the optimizer create its slots as SOK variables. Here an
    embedding variable is an ordinary variable holding this worker's rows, so
    the optimizer's slots are already per-worker: the scope checks that every
    variable is an embedding variable and changes nothing else. It does not
    receive the optimizer, so a Keras checkpoint holding that optimizer saves
    its slots as worker 0's copy (docs/sok.md): give the optimizer to
    ``sok.OptimizerWrapper`` for slots that checkpoint as logical tables.
    """

    def __init__(self, trainable_variables: Sequence):
        not_embedding = [getattr(v, "name", repr(v)) for v in trainable_variables if shard_of(v) is None]
        if not_embedding:
            raise ValueError(f"sok.OptimizerScope takes embedding variables only, got {', '.join(not_embedding)}; "
                             "split them with sok.split_embedding_variable_from_others")
        self.variables = list(trainable_variables)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
