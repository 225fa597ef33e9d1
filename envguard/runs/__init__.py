"""The record of guarded runs: what ran, when, how it ended, in which environment.

- :mod:`envguard.runs.store`: run records, snapshots stored once by content, ``last-good``,
  listing and pruning.
- :mod:`envguard.runs.refs`: ``@last-good``, ``@latest`` and ``@run:N``.
- :mod:`envguard.runs.failure`: what changed since the last successful run, for one that
  just failed.
"""
