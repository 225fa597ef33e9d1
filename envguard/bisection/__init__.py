"""``envguard bisect GOOD.json BAD.json -- CMD``: which change between two environments
breaks the command, found by building the environments in between with uv.

changeset.py (the steps from GOOD to BAD) · builds.py (the exact wheel of a same-version
rebuild) · search.py (ddmin, pure) · trial.py (build one set, run the command, judge) ·
engine.py (the whole search) · report.py (plain data, ``envguard.bisect/1``).
docs/BISECT.md describes it for users.
"""
