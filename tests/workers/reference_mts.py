"""reference/collective-training.md, first example, as written.

Changes: the CollectiveStrategy import, and `import tensorflow.compat.v1 as tf`
because the example is TF1 code (tf.get_variable, tf.train.*) and TensorFlow
2.15's `tensorflow` module no longer has those names.
"""
import tensorflow.compat.v1 as tf
from collective import CollectiveStrategy

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
    train_op = opt.apply_gradients(g_v)
    with tf.train.MonitoredTrainingSession('') as sess:
        emb_result, loss_result, _ = sess.run([emb, loss, train_op])
        print (emb_result, loss_result)
