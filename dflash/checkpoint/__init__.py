"""Drafter exports and training checkpoints: the on-disk layout (:mod:`.layout`), the
published export (:mod:`.export`), one process's checkpoints (:mod:`.local`), torchrun's
DCP shards (:mod:`.sharded`), and a run saved and resumed in either mode
(:mod:`.resume`)."""
