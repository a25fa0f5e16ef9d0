"""`python -m collective.demo` (the README's `make demo`): DLRM on synthetic data with both backends, and a report.

The command line is in :mod:`collective.demo.__main__`.
"""
