"""The console scripts, each ``main(argv) -> exit code``: ``dflash-train``
(:mod:`.train`, also ``torchrun -m dflash.cli.train``), ``dflash-generate``
(:mod:`.generate`) and ``dflash-eval`` (:mod:`.evaluate`). They import nothing heavy until
their input is checked (:mod:`.options`), map errors to exits in one place
(:mod:`.command`), and say what they are doing on stderr (:mod:`.display` for
``dflash-train``, :mod:`.progress` for the other two)."""
