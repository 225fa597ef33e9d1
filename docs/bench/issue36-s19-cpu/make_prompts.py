"""The 24 code prompts of the CPU hybrid run: characters 800-866 (about 32 tokens) of the
first 24 held-out standard-library files (tiny-stdlib's own split) of 3,000+ characters,
written to the JSONL file named by the first argument."""
import json
import sys
import sysconfig
from pathlib import Path

from dflash.stdlib_target import held_out

root = Path(sysconfig.get_paths()["stdlib"])
skip = {"site-packages", "test", "tests"}
files = sorted(p for p in root.rglob("*.py") if not skip & set(p.parts))
rows = []
for p in (p for p in files if held_out(str(p.relative_to(root)), 20)):
    text = p.read_text(errors="replace")
    if len(text) >= 3000:
        rows.append({"prompt": text[800:866]})
    if len(rows) == 24:
        break
Path(sys.argv[1]).write_text("".join(json.dumps(r) + "\n" for r in rows))
