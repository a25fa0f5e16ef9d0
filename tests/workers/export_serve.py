"""Serves SavedModels in plain TensorFlow with ``collective`` and ``horovod`` made unimportable.

argv: export_dir inputs.npz outputs.npz [export_dir inputs.npz outputs.npz ...]
An export_dir without a saved_model.pb is an export base: its newest version
(the largest integer-named folder, as TF Serving picks it) is served.
"""

import importlib.abc
import os
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


def newest_version(export_dir: str) -> str:
    if os.path.exists(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    return os.path.join(export_dir, str(max(int(name) for name in os.listdir(export_dir) if name.isdigit())))


args = sys.argv[1:]
for export_dir, inputs_path, outputs_path in zip(args[0::3], args[1::3], args[2::3]):
    inputs = dict(np.load(inputs_path))
    export_dir = newest_version(export_dir)
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.load(sess, [tf.saved_model.SERVING], export_dir)
        signature = meta.signature_def[tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
        feed = {info.name: inputs[key] for key, info in signature.inputs.items()}
        outputs = sess.run({key: info.name for key, info in signature.outputs.items()}, feed)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    if loaded:
        raise SystemExit(f"modules of {BLOCKED} were loaded: {loaded}")
    np.savez(outputs_path, served_version=np.array(export_dir), **outputs)
    print("served", export_dir, sorted(outputs))
