"""Converters and generators that write the data sets ``collective`` trains on.

Run from the repository root (``python -m datasets.criteo --help``). This
folder is deliberately not installed: a top-level package named ``datasets``
would shadow Hugging Face's library.
"""
