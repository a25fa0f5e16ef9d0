"""reference/collective-training.md, Estimator example, as written except where a comment says "changed".

argv: work_dir ratings_csv [max_steps]

Changes, each marked below: the imports (collective's CollectiveStrategy and
categorical_column_with_embedding; `tensorflow.compat.v1` with TF1 behaviour
because the example is TF 1.x code, as DeepRec runs it), the input (MovieLens ratings from a local CSV with
pandas, each worker reading its share, with a label), and the example's slips
(`self._args.lr`, `strategy.world_size` without the call, a model_fn that
returns nothing outside TRAIN, "./" as model and export directory).
"""
import sys  # changed: directories and the data file come from argv

import pandas as pd  # changed: the input is a local CSV instead of tensorflow_datasets
import tensorflow.compat.v1 as tf  # changed: TF1 names (tf.placeholder, tf.to_float, tf.train.*)
tf.disable_v2_behavior()  # changed: TF 1.x behaviour (ref variables), as DeepRec runs the example
import collective.hash_embedding_column  # changed: DeepRec's categorical_column_with_embedding
from collective import CollectiveStrategy  # changed: collective's CollectiveStrategy

work_dir, ratings_csv = sys.argv[1], sys.argv[2]  # changed
max_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 50  # changed: the doc's 50 unless the test asks fewer

#STEP1:  initialize a collective strategy
strategy = CollectiveStrategy()
#STEP2:  define the data parallel scope
with strategy.scope(), tf.Graph().as_default():
    def input_fn():
        # changed: MovieLens ratings from the local file, this worker's share (every N-th row), label rating >= 4
        ratings = pd.read_csv(ratings_csv)
        ratings = ratings.iloc[strategy.rank()::strategy.world_size()]
        ratings = tf.data.Dataset.from_tensor_slices((
            {
                "movie_id": ratings["movieId"].to_numpy("int64"),
                "user_id": ratings["userId"].to_numpy("int64"),
                "user_rating": ratings["rating"].to_numpy("float32")
            },
            (ratings["rating"].to_numpy("float32") >= 4.0).astype("float32")))
        shuffled = ratings.shuffle(1_000_000,
                                    seed=2021,
                                    reshuffle_each_iteration=False)
        dataset = shuffled.batch(256)
        return dataset

    def input_receiver():
        r'''Prediction input receiver.
        '''
        inputs = {
            "movie_id": tf.placeholder(dtype=tf.int64, shape=[None]),
            "user_id": tf.placeholder(dtype=tf.int64, shape=[None]),
            "user_rating": tf.placeholder(dtype=tf.float32, shape=[None])
        }
        return tf.estimator.export.ServingInputReceiver(inputs, inputs)

    def model_fn(features, labels, mode, params):
        r'''Model function for estimator.
        '''
        del params
        movie_id = features["movie_id"]
        user_id = features["user_id"]
        rating = features["user_rating"]

        embedding_columns = [
            tf.feature_column.embedding_column(
                collective.hash_embedding_column.categorical_column_with_embedding(  # changed: collective's column
                    "movie_id", dtype=tf.int64),
                dimension=16,
                initializer=tf.random_uniform_initializer(-1e-3, 1e-3)),
            tf.feature_column.embedding_column(
                collective.hash_embedding_column.categorical_column_with_embedding(  # changed: collective's column
                    "user_id", dtype=tf.int64),
                dimension=16,
                initializer=tf.random_uniform_initializer(-1e-3, 1e-3))
            ]
        #STEP3:  define the model parallel scope
        with strategy.embedding_scope():
            with tf.variable_scope(
                'embedding',
                partitioner=tf.fixed_size_partitioner(
                strategy.world_size())):  # changed: world_size is a method
                deep_features = [
                    tf.feature_column.input_layer(features, [c])
                    for c in embedding_columns]
        emb = tf.concat(deep_features, axis=-1)
        logits = tf.multiply(emb, 2.0, name='multiply')

        if mode == tf.estimator.ModeKeys.TRAIN:
            labels = tf.reshape(tf.to_float(labels), shape=[-1, 1])
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, logits))
            step = tf.train.get_or_create_global_step()
            opt = tf.train.AdagradOptimizer(learning_rate=0.1)  # changed: was self._args.lr
            train_op = opt.minimize(loss, global_step=step)
            return tf.estimator.EstimatorSpec(
                mode=mode,
                loss=loss,
                train_op=train_op,
                training_chief_hooks=[])

        # changed: the doc returns None here; evaluation and export need a spec
        if mode == tf.estimator.ModeKeys.EVAL:
            labels = tf.reshape(tf.to_float(labels), shape=[-1, 1])
            loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(labels, logits))
            return tf.estimator.EstimatorSpec(mode=mode, loss=loss)
        return tf.estimator.EstimatorSpec(mode=mode, predictions={"logits": logits})
    estimator = strategy.estimator(model_fn=model_fn,
                                   model_dir=work_dir + "/model",  # changed: was "./"
                                   config=None)
    estimator.train_and_evaluate(
      tf.estimator.TrainSpec(
        input_fn=input_fn,
        max_steps=max_steps),  # changed: 50 unless argv says otherwise
      tf.estimator.EvalSpec(
        input_fn=input_fn))
    estimator.export_saved_model(work_dir + "/export", input_receiver)  # changed: was "./"
