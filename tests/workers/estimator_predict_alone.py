"""Rank 0 calls strategy.estimator(...).predict after training while the other workers leave.

argv: model_dir. Expected: rank 0 exits non-zero with collective's WorkersNotInStepError message.
"""

import sys

import tensorflow as tf

import estimator_cases as cases
from collective import CollectiveStrategy

model_dir = sys.argv[1]
strategy = CollectiveStrategy()
r, n = strategy.rank(), strategy.world_size()
with strategy.scope(), tf.Graph().as_default():
    est = strategy.estimator(cases.make_model_fn(strategy), model_dir)
    est.train(lambda: cases.dataset(cases.even_batches(r, n)))
    if r == 0:
        list(est.predict(lambda: cases.dataset(cases.eval_batches(r, n))))
