"""SparseOperationKit's API (``import sparse_operation_kit as sok``) over collective.

    import collective.sok as sok

    sok.Init(global_batch_size=global_batch_size)
    layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=1024, embedding_vec_size=16,
                                      slot_num=10, nnz_per_slot=5, use_hashtable=False)
    emb_vars, other_vars = sok.split_embedding_variable_from_others(model.trainable_variables)
    sok.Saver().dump_to_file(layer.embedding_variable, "/path/to/dir")  # restores on any world size
    model.save_weights(sok.checkpoint_path(prefix))  # every worker; whole tables, restore on any world size

Keys are distributed by ``key % world_size``; each worker holds
``max_vocabulary_size_per_gpu`` rows. Works in TF2 eager / ``tf.function``
and in TF1-style graphs, one process per device under Horovod (start with
``python -m collective.launch``). ``tf.distribute`` strategies are refused.
"""

from collective.sok import optimizers
from collective.sok.checkpoint import checkpoint_path
from collective.sok.embeddings import All2AllDenseEmbedding, DistributedEmbedding
from collective.sok.init import Init, UnsupportedStrategyError
from collective.sok.optimizers import LazyAdamOptimizer
from collective.sok.saver import Saver
from collective.sok.utils import OptimizerScope, split_embedding_variable_from_others
from collective.sok.v2_dump import dump, incremental_dump, load  # SOK v2 (incremental_dump: SOK 2.1)
from collective.sok.v2_lookup import lookup_sparse
from collective.sok.v2_optimizer import OptimizerWrapper
from collective.sok.v2_variables import DynamicVariable, Variable, filter_variables, init

__all__ = ["All2AllDenseEmbedding", "DistributedEmbedding", "Init", "LazyAdamOptimizer", "OptimizerScope",
           "Saver", "UnsupportedStrategyError", "checkpoint_path", "optimizers",
           "split_embedding_variable_from_others", "DynamicVariable", "OptimizerWrapper", "Variable", "dump",
           "filter_variables", "incremental_dump", "init", "load", "lookup_sparse"]
