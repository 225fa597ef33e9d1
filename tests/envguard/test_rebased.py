"""envguard.paths.rebased: the one rule for a path of an environment said of its scratch copy
(and back), used by the copy's plan, its facts, the borrowed memo and the prediction."""

from __future__ import annotations

from envguard.paths import rebased


def test_a_path_inside_or_at_the_folder_moves_and_no_other_does() -> None:
    assert rebased("/v/env/lib/x.py", "/v/env", "/v/.env.copy") == "/v/.env.copy/lib/x.py"
    assert rebased("/v/env", "/v/env", "/v/.env.copy") == "/v/.env.copy"
    assert rebased("/v/env2/lib", "/v/env", "/v/.env.copy") == "/v/env2/lib"  # a sibling
    assert rebased("/v/en", "/v/env", "/v/.env.copy") == "/v/en"
    assert rebased("relative/env/x", "/v/env", "/c") == "relative/env/x"
