"""Checkpoints of whole logical tables, written and read by every worker.

    saver = collective.checkpoint.Saver()          # inside the graph, on every worker
    saver.save(sess, "model_dir/model.ckpt", global_step=step)   # every worker, same step
    saver.restore(sess, tf.train.latest_checkpoint("model_dir")) # any world size
    saver.save_incremental(sess, "model_dir/model.ckpt", global_step=step)   # only the rows changed since
    saver.restore(sess, latest_incremental_checkpoint("model_dir"))           # base + deltas, any world size

Inside ``CollectiveStrategy.scope()`` the default ``Scaffold`` (and so
``MonitoredTrainingSession``) uses this Saver. See docs/checkpoints.md.
"""

from collective.checkpoint.manifest import ChainError, latest_incremental_checkpoint
from collective.checkpoint.model_dir import CheckpointMismatchError, ModelDirError, check_model_dir
from collective.checkpoint.saver import CheckpointError, Saver

__all__ = ["Saver", "check_model_dir", "latest_incremental_checkpoint", "CheckpointError", "CheckpointMismatchError",
           "ChainError", "ModelDirError"]
