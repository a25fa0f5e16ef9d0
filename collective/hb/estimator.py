"""``hb.estimator``: HybridBackend's Estimator names over :mod:`collective.integration.estimator`.

    model = hb.estimator.Estimator(model_fn=model_fn, model_dir=model_dir)
    hb.estimator.train_and_evaluate(model, train_spec, eval_spec)
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from collective.hb.scope import strategy

EstimatorSpec = tf.estimator.EstimatorSpec


def Estimator(model_fn: Callable, model_dir: Optional[str] = None, config=None, params=None,  # noqa: N802
              **kwargs):
    """An Estimator that trains, evaluates, predicts and exports on every worker.

    Without ``model_dir`` (here or in ``config``), worker 0 makes a temporary
    directory and every worker uses it, as ``tf.estimator.Estimator`` makes one
    per process (on several hosts pass a model_dir on a shared file system).
    ``shard_input``, ``throughput_every_n_steps``, ``incremental_save_steps``,
    ``incremental_save_secs`` and ``warm_start_from`` are passed to
    :class:`collective.integration.estimator.CollectiveEstimator`; any other keyword argument
    is refused with a ``TypeError``.
    """
    from collective.integration.estimator import build_estimator  # pylint: disable=import-outside-toplevel

    return build_estimator(strategy(), model_fn, model_dir, config=config, params=params, **kwargs)


def train_and_evaluate(estimator, train_spec: tf.estimator.TrainSpec, eval_spec: tf.estimator.EvalSpec):
    """Trains and evaluates ``estimator`` (made by :func:`Estimator`) on every worker."""
    if not hasattr(estimator, "train_and_evaluate"):
        raise TypeError(f"hb.estimator.train_and_evaluate needs an estimator made by hb.estimator.Estimator, got "
                        f"{type(estimator).__name__}")
    return estimator.train_and_evaluate(train_spec, eval_spec)
