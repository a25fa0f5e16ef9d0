"""hb.train optimizer wrappers on N workers; writes rank<r>.npz.

argv: out_dir

For every optimizer in api_hb_cases.OPTIMIZERS, ``hb.train.<Name>`` is built
outside ``hb.scope()`` (as HybridBackend's recipes do) and, for two of them,
inside it too (the wrapper must not average twice); a user class goes
through ``hb.train.wraps_optimizer``.
"""

import os
import sys

import numpy as np

import api_hb_cases as hbc
import embedding_cases as cases
import collective.hb as hb

out_dir = sys.argv[1]
r, n = hb.context.rank, hb.context.world_size
batches = [cases.local_batch(step, r, n) for step in range(cases.STEPS)]
results = {}
for name, kwargs in hbc.OPTIMIZERS.items():
    losses, (table, w) = hbc.train(lambda: getattr(hb.train, name)(**kwargs), batches, hb.embedding_scope)
    results.update({f"{name}_losses": losses, f"{name}_table": table, f"{name}_w": w})
for name in ("AdagradOptimizer", "FtrlOptimizer"):
    kwargs = hbc.OPTIMIZERS[name]
    losses, (table, w) = hbc.train(lambda: getattr(hb.train, name)(**kwargs), batches, hb.embedding_scope, hb.scope)
    results.update({f"scoped_{name}_losses": losses, f"scoped_{name}_table": table, f"scoped_{name}_w": w})
MySGD = hb.train.wraps_optimizer(hbc.PlainSGD)
losses, (table, w) = hbc.train(lambda: MySGD(0.5), batches, hb.embedding_scope)
results.update({"user_losses": losses, "user_table": table, "user_w": w})
# Inside hb.scope(), a user apply_gradients calling super() must not average (divide by N) a second time.
OverridingSGD = hb.train.wraps_optimizer(hbc.OverridingSGD)
losses, (table, w) = hbc.train(lambda: OverridingSGD(0.5), batches, hb.embedding_scope, hb.scope)
results.update({"override_losses": losses, "override_table": table, "override_w": w})
np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
