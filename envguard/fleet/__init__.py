"""Many snapshots of one distributed job (``envguard fleet``): which node or rank differs?

- :mod:`envguard.fleet.analyse`: group snapshots into identical environments and explain
  each outlier group against the baseline;
- :mod:`envguard.fleet.gather`: who this rank is, the shared-folder transport, and reading
  fleet documents;
- :mod:`envguard.fleet.wire` and :mod:`envguard.fleet.listen`: envguard's own
  authenticated TCP transport, every rank's snapshot to rank 0 (no torch, no pickle).
"""
