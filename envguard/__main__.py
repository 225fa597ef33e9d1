"""``python -m envguard``."""

from __future__ import annotations

import sys

from envguard.cli import main

if __name__ == "__main__":
    sys.exit(main())
