"""``python -m envguard``."""

from __future__ import annotations

import os
import sys

# ``python -m`` puts the working folder first on sys.path, so a ``random.py`` or
# ``typing.py`` there (the very shadowing envguard diagnoses) would be imported by envguard
# itself. The package is imported already (runpy found it), and its own modules come from
# its ``__path__``: the entry can go, as ``python -P`` would drop it.
if (sys.path and not getattr(sys.flags, "safe_path", False)
        and sys.path[0] in ("", os.getcwd())):
    del sys.path[0]

from envguard.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
