"""``python -m envguard``."""

from __future__ import annotations

import sys

from envguard.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
