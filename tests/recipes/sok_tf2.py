"""reference/sok-get-started.md, "Use SparseOperationKit with Horovod" (TF2), run as written.

argv: out_dir keras_adam|sok_adam|lazy_adam float64|float32 [export]

Changes to the recipe, each marked "CHANGED" below:
- imports: ``import collective.sok as sok`` for ``import sparse_operation_kit as sok``;
  the launcher sets CUDA_VISIBLE_DEVICES, so the recipe's line setting it is dropped.
- dtype: ``tf.keras.backend.set_floatx`` from argv. The parity runs use float64:
  in float32 the order in which a sum is taken (one process, the batch summed in
  two halves) already moves some weights of this model by 2e-2 to 6e-1 after 20
  steps, so no float32 run can match another to 1e-5. The float32 run keeps the
  recipe's dtype at learning rate 0.01 (api_sok_cases.FLOAT32_LEARNING_RATE).
- data and size: ``dataset = ...`` is GLOBAL_BATCH / N rows per worker of keys
  drawn from 1000 arbitrary int64 values (api_sok_cases), global_batch_size 12
  instead of 65536, num_of_dense_layers 2 instead of 7 (CPU time).
- the Dense layers get fixed initial weights after the model is built (Keras'
  are random per process; the reference starts from the same ones).
- evident slips: ``tf.keras.BinaryCrossentropy`` -> ``tf.keras.losses.BinaryCrossentropy``;
  ``hvd.allreduce(grads)`` -> ``hvd.allreduce(grads, op=hvd.Sum)``: each worker's
  loss is already divided by the global batch size, so the workers' gradients
  are parts of one sum (averaging them would divide the gradient by N).
- the optimizer choice comes from argv: ``keras_adam`` (use_tf_opt = True),
  ``sok_adam`` (use_tf_opt = False), ``lazy_adam`` (sok.LazyAdamOptimizer under OptimizerScope).

Ours, after the recipe's training loop (marked "ADDED"; the recipe has no save or export step), with argv's
``export``: every worker saves the trained model with ``tf.train.Checkpoint`` through ``sok.checkpoint_path``
(docs/sok.md, "Keras checkpoints"), predicts its share of ``cases.serving_keys()`` with ``training=False``,
and ``export_saved_model`` (rank 0) writes a SavedModel from that object-based checkpoint, the serving model
built once more in a graph (docs/checkpoints.md); test_api_sok.py serves it in plain TensorFlow against those
predictions. The recipe is TF2 code (eager, ``tf.function``); its TF 1.15 twin is sok_tf1.py.
"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workers"))  # CHANGED: the test's cases
import api_sok_cases as cases  # noqa: E402
import collective.sok as sok  # CHANGED: import
from collective.embedding import hash_table
from collective.integration.export import export_saved_model  # ADDED: the export step

out_dir, which, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
export = sys.argv[4:] == ["export"]  # ADDED: the run whose export the test serves
tf.keras.backend.set_floatx(dtype)  # CHANGED: dtype

import horovod.tensorflow as hvd
hvd.init()


from sok_demo_model import DemoModel  # the recipe's model, as written


global_batch_size = cases.GLOBAL_BATCH  # CHANGED: 65536
use_tf_opt = which != "sok_adam"
learning_rate = cases.learning_rate(dtype)  # CHANGED: 0.01 for float32 only

sok.Init(global_batch_size=global_batch_size)

model = DemoModel(max_vocabulary_size_per_gpu=1024,
                  slot_num=10,
                  nnz_per_slot=5,
                  embedding_vector_size=16,
                  num_of_dense_layers=cases.DENSE_LAYERS)  # CHANGED: 7
model(cases.local_batch(0, hvd.rank(), hvd.size())[0], training=False)  # CHANGED: build, then fixed dense weights
cases.set_dense_weights(model.dense_layers + [model.out_layer])

if not use_tf_opt:
    emb_opt = sok.optimizers.Adam(learning_rate=learning_rate)
elif which == "lazy_adam":
    emb_opt = sok.LazyAdamOptimizer(learning_rate=learning_rate)  # CHANGED: the lazy variant
else:
    emb_opt = tf.keras.optimizers.Adam(learning_rate=learning_rate)

dense_opt = tf.keras.optimizers.Adam(learning_rate=learning_rate)

loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)  # CHANGED: slip
def _replica_loss(labels, logits):
    loss = loss_fn(labels, logits)
    return tf.nn.compute_average_loss(loss, global_batch_size=global_batch_size)

@tf.function
def _train_step(inputs, labels, first_batch):
    with tf.GradientTape() as tape:
        logits = model(inputs, training=True)
        loss = _replica_loss(labels, logits)
    emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
    emb_grads, other_grads = tape.gradient(loss, [emb_var, other_var])
    if use_tf_opt:
        with sok.OptimizerScope(emb_var):
            emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                    experimental_aggregate_gradients=False)
    else:
        emb_opt.apply_gradients(zip(emb_grads, emb_var),
                                experimental_aggregate_gradients=False)

    other_grads = [hvd.allreduce(grads, op=hvd.Sum) for grads in other_grads]  # CHANGED: slip
    dense_opt.apply_gradients(zip(other_grads, other_var))

    if first_batch:
        hvd.broadcast_variables(other_var, root_rank=0)
        hvd.broadcast_variables(dense_opt.variables(), root_rank=0)

    return loss

dataset = [cases.local_batch(step, hvd.rank(), hvd.size()) for step in range(cases.STEPS)]  # CHANGED: data

losses = []
for i, (inputs, labels) in enumerate(dataset):
    replica_loss = _train_step(inputs, labels, 0 == i)
    total_loss = hvd.allreduce(replica_loss)
    print("[SOK INFO]: Iteration: {}, loss: {}".format(i, total_loss))
    losses.append(float(total_loss))

emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
held_keys, held_rows = hash_table.table_of(emb_var[0]).entries()
results = dict(losses=np.array(losses), keys=held_keys.numpy(), vectors=tf.gather(emb_var[0], held_rows).numpy(),
               table_name=emb_var[0].name.split(":")[0], **{f"dense{i}": v.numpy() for i, v in enumerate(other_var)})

if export:
    # ADDED: the trained model's checkpoint (a collective: every worker saves, worker 0's file is the checkpoint),
    # this worker's predictions of its share of the serving batch, and the export rank 0 writes from the checkpoint.
    checkpoint = os.path.join(out_dir, "model", "ckpt")
    tf.train.Checkpoint(model=model).write(sok.checkpoint_path(checkpoint))
    per = global_batch_size // hvd.size()
    results["predicted"] = model(cases.serving_keys()[hvd.rank() * per:(hvd.rank() + 1) * per], training=False).numpy()

    def serving_signature():  # the model once more, on the serving inputs, in the export graph
        keys = tf.compat.v1.placeholder(tf.int64, [None, cases.SLOT_NUM, cases.NNZ], name="inputs")
        serving_model = DemoModel(max_vocabulary_size_per_gpu=1024, slot_num=10, nnz_per_slot=5,
                                  embedding_vector_size=16, num_of_dense_layers=cases.DENSE_LAYERS)
        return tf.compat.v1.saved_model.predict_signature_def({"inputs": keys},
                                                              {"logits": serving_model(keys, training=False)})

    export_saved_model(os.path.join(out_dir, "export"), checkpoint, serving_signature)
np.savez(os.path.join(out_dir, f"rank{hvd.rank()}.npz"), **results)

# Not in the recipe: DistributedEmbedding (mean and sum) and a dynamic-input All2AllDenseEmbedding, with
# use_hashtable=False and a fixed table, on this worker's share, eagerly and in tf.function, against numpy;
# and the recipe's layer with training=False: keys it never saw read zeros and are not inserted.
tf.keras.backend.set_floatx("float32")
lookups = {}
keys = cases.index_keys(hvd.rank(), hvd.size())
sparse = cases.sparse_keys(keys)
table = cases.table_values()[:1024 * hvd.size()]
for combiner in ("Mean", "sum"):
    layer = sok.DistributedEmbedding(combiner, max_vocabulary_size_per_gpu=1024, embedding_vec_size=16,
                                     slot_num=cases.SLOT_NUM, max_nnz=cases.NNZ, use_hashtable=False,
                                     embedding_initializer=tf.keras.initializers.Constant(table))
    lookups[f"distributed_{combiner}_eager"] = layer(sparse).numpy()
    lookups[f"distributed_{combiner}_function"] = tf.function(layer)(sparse).numpy()
dynamic = sok.All2AllDenseEmbedding(1024, 16, slot_num=1, nnz_per_slot=1, dynamic_input=True, use_hashtable=False,
                                    embedding_initializer=tf.keras.initializers.Constant(table))
unique, _ = tf.unique(tf.reshape(keys, [-1]))
lookups["dynamic_keys"], lookups["dynamic"] = unique.numpy(), dynamic(unique).numpy()
size_before = int(hash_table.table_of(emb_var[0]).size())
probe = np.array([[[k] * 5 for k in (7, 3, 11, 3, -5, 13, 17, 19, 23, 29)]], np.int64)  # 3 was trained
lookups["inference_keys"] = probe
lookups["inference"] = tf.function(lambda k: model.embedding_layer(k, training=False))(probe).numpy()
lookups["inference_size_change"] = int(hash_table.table_of(emb_var[0]).size()) - size_before
np.savez(os.path.join(out_dir, f"lookups{hvd.rank()}.npz"), **lookups)
