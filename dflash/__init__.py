"""dflash: a DFlash drafter trainer (block-diffusion drafter for speculative decoding).

Read it bottom up:

* ``config``, ``presets``: the typed configs and their named instances (no torch);
* ``model``, ``masks``, ``loss``, ``optim``: the drafter, its attention mask, its loss and
  its optimizer; ``target``: the frozen target model it learns from;
* ``data``, ``batching``: JSONL to examples; fixed-shape batches, this rank's share, the
  prefetch thread;
* ``parallelize``: device, dtype, FSDP2 and the compiled kernels, in that order;
  ``compilation/``: torch.compile without the race (kernels, Mega-Cache, race harness);
  ``distributed/``: the ranks of a torchrun launch and split roles;
* ``train``: the loop and its ``TrainState``; ``checkpoint/``: exports and checkpoints
  in either mode; ``flops``, ``meter``: what a step costs and how fast it ran;
* ``decoding/``: generating with the target and speculative decoding;
* ``cli/``: the console scripts dflash-train, dflash-generate and dflash-eval;
  ``errors``, ``exitcodes``: the one exception tree and the exit codes it maps to.
"""

__all__: list[str] = []
