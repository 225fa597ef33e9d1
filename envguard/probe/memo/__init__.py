"""The old name of :mod:`envguard.probe.fastpath`, kept for one importer.

:mod:`envguard.gate.closure` still imports :data:`MEMO_BYTES` and :func:`prune` from here;
once it imports them from :mod:`envguard.probe.fastpath`, this package goes. Nothing else
may import it (``tests/test_architecture.py``).
"""
