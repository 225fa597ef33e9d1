"""envguard's memo files: answers kept on disk only to make the next snapshot faster.

Every memo is private to this machine, checked on use, and ignored when unreadable or
stale, so deleting one only costs time. They live in :func:`envguard.paths.memo_dir`.
(The compile caches a snapshot records are torch's and triton's: :mod:`envguard.probe.caches`.)

- :mod:`~envguard.probe.memo.marshal_file`: the ``marshal`` file format and stat keys;
- :mod:`~envguard.probe.memo.hashes`: file digests for ``--verify hash``;
- :mod:`~envguard.probe.memo.records`: parsed RECORD files and dist-info folders, their
  rows kept as :mod:`~envguard.probe.memo.rows`;
- :mod:`~envguard.probe.memo.gpu`: ``nvidia-smi``'s answer, keyed by the driver's state;
- :mod:`~envguard.probe.memo.facts`: the interpreter probe's answer, keyed by everything it
  depends on;
- :mod:`~envguard.probe.memo.prune`: memo files unused for a month removed, at most once a
  day, where memo files are written.
"""
