"""reference/sok-get-started.md, "TensorFlow 1.15" with Horovod, run as written in a TF1 graph.

argv: out_dir float64|float32

Changes, each marked "CHANGED":
- imports: ``collective.sok`` for ``sparse_operation_kit``; ``tensorflow.compat.v1``
  with TF1 behaviour (the recipe is TF 1.15 code); the launcher sets
  CUDA_VISIBLE_DEVICES, so the recipe's line setting it is dropped.
- dtype, model and data as in sok_tf2.py (``set_floatx`` from argv, DemoModel
  from sok_demo_model as written, 2 dense layers, global batch 12, fixed initial
  dense weights);
  ``inputs, labels`` are placeholders fed each step's share, and the loop runs
  ``cases.STEPS`` iterations.
- ``tf.keras.optimizers.Adam`` is the legacy Keras Adam
  (``tf.keras.optimizers.legacy.Adam``): TensorFlow 2.15's new Keras optimizers
  do not build TF1 graphs.
- evident slips: ``logit`` -> ``logits``; ``train_step(inputs, labels)`` gets its
  ``training`` argument; ``hvd.reduce`` (no such function) -> ``hvd.allreduce(op=hvd.Sum)``;
  dense gradients summed (``op=hvd.Sum``), as in sok_tf2.py.

Ours, after the recipe's training loop (marked "ADDED"; the recipe has no save or export step): the trained
model is saved with ``collective.checkpoint.Saver`` and exported with ``export_saved_model``
(docs/checkpoints.md), and each worker predicts its share of ``cases.serving_keys()`` with ``training=False``;
test_api_sok.py serves the export in plain TensorFlow against those predictions.
"""
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf  # CHANGED: TF1 API

tf.disable_v2_behavior()  # CHANGED: TF 1.15 behaviour (graphs, ref variables)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers"))  # CHANGED: the test's cases
import api_sok_cases as cases  # noqa: E402
import collective.sok as sok  # CHANGED: import
from sok_demo_model import DemoModel
from collective.embedding import hash_table
from collective.checkpoint import Saver  # ADDED: the export step
from collective.integration.export import export_saved_model  # ADDED: the export step

out_dir, dtype = sys.argv[1], sys.argv[2]
tf.keras.backend.set_floatx(dtype)  # CHANGED: dtype

import horovod.tensorflow as hvd
hvd.init()

global_batch_size = cases.GLOBAL_BATCH  # CHANGED: 65536
use_tf_opt = True

sok_init_op = sok.Init(global_batch_size=global_batch_size)

model = DemoModel(max_vocabulary_size_per_gpu=1024,
                  slot_num=10,
                  nnz_per_slot=5,
                  embedding_vector_size=16,
                  num_of_dense_layers=cases.DENSE_LAYERS)  # CHANGED: 7

if not use_tf_opt:
    emb_opt = sok.optimizers.Adam(learning_rate=0.1)
else:
    emb_opt = tf.keras.optimizers.legacy.Adam(learning_rate=cases.learning_rate(dtype))  # CHANGED: legacy
dense_opt = tf.keras.optimizers.legacy.Adam(learning_rate=cases.learning_rate(dtype))  # CHANGED: legacy

loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
def _replica_loss(labels, logits):
    loss = loss_fn(labels, logits)
    return tf.nn.compute_average_loss(loss, global_batch_size=global_batch_size)

def train_step(inputs, labels, training):
    logits = model(inputs, training=training)
    loss = _replica_loss(labels, logits)  # CHANGED: slip logit
    emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
    grads = tf.gradients(loss, emb_var + other_var, colocate_gradients_with_ops=True)
    emb_grads, other_grads = grads[:len(emb_var)], grads[len(emb_var):]

    if use_tf_opt:
        with sok.OptimizerScope(emb_var):
            emb_train_op = emb_opt.apply_gradients(zip(emb_grads, emb_var))
    else:
        emb_train_op = emb_opt.apply_gradients(zip(emb_grads, emb_var))

    other_grads = [hvd.allreduce(grad, op=hvd.Sum) for grad in other_grads]  # CHANGED: slip
    other_train_op = dense_opt.apply_gradients(zip(other_grads, other_var))

    with tf.control_dependencies([emb_train_op, other_train_op]):
        total_loss = hvd.allreduce(loss, op=hvd.Sum)  # CHANGED: slip hvd.reduce
        total_loss = tf.identity(total_loss)

        return total_loss

# CHANGED: dataset = ... -> placeholders fed with this worker's share
inputs = tf.placeholder(tf.int64, [None, cases.SLOT_NUM, cases.NNZ])
labels = tf.placeholder(dtype, [None, 1])
loss = train_step(inputs, labels, training=True)  # CHANGED: slip, training argument
dense_init = [v.assign(value) for v, value in zip(
    [v for layer in model.dense_layers + [model.out_layer] for v in layer.weights],
    cases.dense_weights([tuple(v.shape) for layer in model.dense_layers + [model.out_layer] for v in layer.weights],
                        dtype))]

init_op = tf.group(tf.global_variables_initializer(),
                   tf.local_variables_initializer())

losses = []
with tf.Session() as sess:
    sess.run(sok_init_op)
    sess.run(init_op)
    sess.run(dense_init)  # CHANGED: fixed initial dense weights

    for step in range(cases.STEPS):  # CHANGED: iterations
        batch_inputs, batch_labels = cases.local_batch(step, hvd.rank(), hvd.size())
        batch_labels = batch_labels.astype(dtype)
        loss_v = sess.run(loss, {inputs: batch_inputs, labels: batch_labels})
        print("[SOK INFO]: Iteration: {}, loss: {}".format(step, loss_v))
        losses.append(loss_v)
    emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
    held_keys, held_rows = hash_table.table_of(emb_var[0]).entries()
    values = sess.run([held_keys, tf.gather(emb_var[0], held_rows), list(other_var)])

    # ADDED: the trained model's checkpoint (a collective: every worker saves) and its predictions of this
    # worker's share of the serving batch.
    checkpoint = Saver(var_list=model.trainable_variables).save(sess, os.path.join(out_dir, "model", "model.ckpt"))
    per = cases.GLOBAL_BATCH // hvd.size()
    serving_inputs = tf.placeholder(tf.int64, [None, cases.SLOT_NUM, cases.NNZ])
    predicted = sess.run(model(serving_inputs, training=False),
                         {serving_inputs: cases.serving_keys()[hvd.rank() * per:(hvd.rank() + 1) * per]})


def serving_signature():  # ADDED: the model once more on the serving inputs, in the export graph
    keys = tf.placeholder(tf.int64, [None, cases.SLOT_NUM, cases.NNZ], name="inputs")
    serving_model = DemoModel(max_vocabulary_size_per_gpu=1024, slot_num=10, nnz_per_slot=5, embedding_vector_size=16,
                              num_of_dense_layers=cases.DENSE_LAYERS)
    return tf.saved_model.predict_signature_def({"inputs": keys}, {"logits": serving_model(keys, training=False)})


export_saved_model(os.path.join(out_dir, "export"), checkpoint, serving_signature)  # ADDED: rank 0 writes it
np.savez(os.path.join(out_dir, f"rank{hvd.rank()}.npz"), losses=np.array(losses) / hvd.size(), keys=values[0],
         vectors=values[1], table_name=emb_var[0].op.name, predicted=predicted,  # ADDED: predicted
         **{f"dense{i}": v for i, v in enumerate(values[2])})
