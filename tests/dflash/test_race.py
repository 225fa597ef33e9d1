"""Race regression (issue test 9): threads start after the trainer-style warm-up on a
fresh compile cache, and none fails or hangs; a late new shape on a helper thread is
refused instead of compiled there.

This runs the real compiled flex_attention on CPU, forward only: torch has no flex
backward on CPU. The forward-and-backward version, and the naive pattern for contrast,
run on the GPU machine (benchmarks/gpu_dflash.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_guarded_threads_after_warmup_never_race(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    proc = subprocess.run(
        [sys.executable, "-m", "dflash.compilation.race", "--mode", "guarded", "--threads", "3",
         "--iters", "3", "--seq", "256", "--late-seq", "384", "--timeout", "240",
         "--device", "cpu"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outcomes"] == ["ok", "ok", "ok"]
    assert result["hang"] is False
    assert result["fx_tracing_flag_after"] is False
    late = result["late_shape"]
    assert late.startswith("error:") and "recompil" in late.lower(), late
    # The cache really was cold: the warm-up filled it.
    assert any((tmp_path / "inductor").rglob("*")), "warm-up wrote nothing to the cache"
