"""dflash: a DFlash drafter trainer (issue 5); for now the guarded entry point only."""

__all__: list[str] = []
