"""The model zoo: recipes to run and copy, each a TF1-style Estimator ``model_fn`` on ``embedding_scope()``.

    python modelzoo/dlrm/train.py --help                       # one process
    python -m collective.launch -n 2 modelzoo/dlrm/train.py    # two workers

Models: :mod:`modelzoo.dlrm`, :mod:`modelzoo.deepfm`, :mod:`modelzoo.movielens`.
Shared pieces, written once: :mod:`modelzoo.spec` (feature specs from the
dataset schema), :mod:`modelzoo.features` (embedding layers, MLPs, serving
inputs), :mod:`modelzoo.heads` (loss, metrics, train op),
:mod:`modelzoo.flags` (the command line), :mod:`modelzoo.data` (data sets and
``input_fn``), :mod:`modelzoo.engine` (train / evaluate / export on every
worker) and :mod:`modelzoo.runner` (what each ``train.py`` calls).
:mod:`modelzoo.repository` gives them the repository's ``datasets`` package,
which is not installed.
"""
