"""torch.compile for the trainer without the race: the process's compiled attention
kernels and the seal (:mod:`.kernels`), the portable Mega-Cache (:mod:`.megacache`), and
the race reproduced (``python -m dflash.compilation.race``, :mod:`.race`)."""
