"""Many snapshots of one distributed job (``envguard fleet``): which node or rank differs?

- :mod:`envguard.fleet.analyse`: group snapshots into identical environments and explain
  each outlier group against the baseline;
- :mod:`envguard.fleet.gather`: every rank's snapshot to rank 0, over torch.distributed or
  a shared folder, and reading fleet documents.
"""
