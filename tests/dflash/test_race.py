"""Race regression (issue test 9): threads start after the trainer-style warm-up on a
fresh compile cache, and none fails or hangs; a late new shape on a helper thread is
refused instead of compiled there.

This runs the real compiled flex_attention on CPU, forward only: torch has no flex
backward on CPU. The forward-and-backward version, and the naive pattern for contrast,
run on the GPU machine (benchmarks/gpu_dflash.py).
"""

from __future__ import annotations

import pytest

from tests.dflash.conftest import ColdRace


@pytest.mark.slow
def test_guarded_threads_after_warmup_never_race(cold_guarded_race: ColdRace) -> None:
    result = cold_guarded_race.result
    assert result["outcomes"] == ["ok", "ok", "ok"]
    assert result["hang"] is False
    assert result["fx_tracing_flag_after"] is False
    late = str(result["late_shape"])
    assert late.startswith("error:") and "recompil" in late.lower(), late
    # The cache really was cold: the warm-up filled it.
    assert any((cold_guarded_race.root / "a" / "inductor").rglob("*")), \
        "warm-up wrote nothing to the cache"
