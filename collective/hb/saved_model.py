"""``hb.saved_model.export``: a SavedModel with whole tables that plain TensorFlow serves."""

from __future__ import annotations

from typing import Callable


def export(export_dir_base: str, checkpoint_path: str, signature_def_fn: Callable, **kwargs):
    """Rank 0 writes a SavedModel from ``checkpoint_path``; ``signature_def_fn()`` builds the serving graph.

    ``signature_def_fn`` builds the model on its own inputs and returns a
    ``SignatureDef`` (``tf.compat.v1.saved_model.predict_signature_def``) or
    a dict of them. See :func:`collective.integration.export.export_saved_model`.
    """
    from collective.integration.export import export_saved_model  # pylint: disable=import-outside-toplevel

    return export_saved_model(export_dir_base, checkpoint_path, signature_def_fn, **kwargs)
