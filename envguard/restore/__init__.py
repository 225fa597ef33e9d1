"""``envguard restore``: rebuild a good snapshot's package set ("restore, don't fix").

- :mod:`envguard.restore.plan`: what to install, change or remove, as requirements and
  a PEP 751 pylock; nothing runs;
- :mod:`envguard.restore.build`: run uv to build a new venv (or sync one in place);
- :mod:`envguard.restore.verify`: prove the result against the good snapshot.
"""
