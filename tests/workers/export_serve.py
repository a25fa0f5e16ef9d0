"""Serves a SavedModel in plain TensorFlow with ``collective`` and ``horovod`` made unimportable.

argv: export_dir inputs.npz outputs.npz
"""

import importlib.abc
import sys

BLOCKED = ("collective", "horovod")


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname} is blocked in this serving test")
        return None


sys.meta_path.insert(0, Blocker())

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

for name in BLOCKED:
    try:
        __import__(name)
    except ImportError:
        continue
    raise SystemExit(f"{name} could be imported: the blocker does not work")

export_dir, inputs_path, outputs_path = sys.argv[1:4]
inputs = dict(np.load(inputs_path))
with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export_dir)
    signature = meta.signature_def[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
    feed = {info.name: inputs[key] for key, info in signature.inputs.items()}
    outputs = sess.run({key: info.name for key, info in signature.outputs.items()}, feed)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
if loaded:
    raise SystemExit(f"modules of {BLOCKED} were loaded: {loaded}")
np.savez(outputs_path, **outputs)
print("served", sorted(outputs))
