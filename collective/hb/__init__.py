"""HybridBackend's API (``import hybridbackend.tensorflow as hb``) over collective.

    import collective.hb as hb

    with hb.scope():
        with hb.embedding_scope():
            table = tf.compat.v1.get_variable("table", [vocab, dim])   # sharded by rows, i % N
        emb = tf.nn.embedding_lookup(table, ids)
        opt = hb.train.AdagradOptimizer(0.1)                           # dense gradients averaged

Sub-modules: :mod:`train`, :mod:`estimator`, :mod:`data`, :mod:`saved_model`;
``hb.context`` holds rank, world size and the ``HB_*`` tuning options. The
exchange is always collective's ``hb`` backend (``id % N``, deduplicated ids,
alltoall), whatever ``COLLECTIVE_STRATEGY`` says.
"""

from collective.hb import data, estimator, saved_model, train
from collective.hb.context import context
from collective.hb.scope import embedding_scope, scope, strategy

__all__ = ["context", "data", "embedding_scope", "estimator", "saved_model", "scope", "strategy", "train"]
