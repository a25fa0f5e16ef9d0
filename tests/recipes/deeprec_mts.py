"""reference/collective-training.md, first example (MonitoredTrainingSession), as written.

argv: [work_dir]

Changes, each marked "CHANGED" or "ADDED": the CollectiveStrategy import; `import tensorflow.compat.v1 as tf`
with TF1 behaviour (the example is TF 1.x code, as DeepRec runs it: tf.get_variable, tf.train.*, ref
variables). With a work_dir the doc's STEP "Use export_saved_model when exporting" is added: the session
gets a global step and a checkpoint_dir, and the trained table is exported with strategy.export_saved_model,
serving the looked-up rows of the ids it is fed.
"""
import sys  # ADDED: the work_dir

import tensorflow.compat.v1 as tf  # CHANGED: TF1 names
tf.disable_v2_behavior()  # CHANGED: TF 1.x behaviour
from collective import CollectiveStrategy  # CHANGED: collective's CollectiveStrategy

work_dir = sys.argv[1] if len(sys.argv) > 1 else None  # ADDED

#STEP1:  initialize a collective strategy
strategy = CollectiveStrategy()
#STEP2:  define the data parallel scope
with strategy.scope(), tf.Graph().as_default():
    #STEP3:  define the model parallel scope
    with strategy.embedding_scope():
        var = tf.get_variable(
            'var_1',
            shape=(1000, 3),
            initializer=tf.ones_initializer(tf.float32),
            partitioner=tf.fixed_size_partitioner(num_shards=strategy.world_size())
        )
    emb = tf.nn.embedding_lookup(
        var, tf.cast([0, 1, 2, 5, 6, 7], tf.int64))
    fun = tf.multiply(emb, 2.0, name='multiply')
    loss = tf.reduce_sum(fun, name='reduce_sum')
    opt = tf.train.FtrlOptimizer(
        0.1,
        l1_regularization_strength=2.0,
        l2_regularization_strength=0.00001)
    g_v = opt.compute_gradients(loss)
    train_op = opt.apply_gradients(g_v, global_step=tf.train.get_or_create_global_step())  # ADDED: global step
    with tf.train.MonitoredTrainingSession('', checkpoint_dir=work_dir) as sess:  # ADDED: checkpoint_dir
        emb_result, loss_result, _ = sess.run([emb, loss, train_op])
        print (emb_result, loss_result)

    if work_dir:  # ADDED: the doc's "Use export_saved_model when exporting"
        def serving_signature():
            ids = tf.placeholder(tf.int64, [None], name="ids")
            with strategy.embedding_scope():
                table = tf.get_variable('var_1', shape=(1000, 3), initializer=tf.ones_initializer(tf.float32),
                                        partitioner=tf.fixed_size_partitioner(num_shards=strategy.world_size()))
            rows = tf.nn.embedding_lookup(table, ids)
            return tf.saved_model.predict_signature_def({"ids": ids}, {"emb": rows})

        strategy.export_saved_model(work_dir + "/export", tf.train.latest_checkpoint(work_dir), serving_signature)
