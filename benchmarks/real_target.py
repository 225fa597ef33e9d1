"""A real small target for the DFlash experiments, trained here from the Python source on
the machine (no downloads): a byte-level BPE tokenizer and a Qwen3-architecture causal LM.

    python benchmarks/real_target.py --out runs/real --size tiny --minutes 0.2   # CPU smoke
    python benchmarks/real_target.py --out $OUT --work /tmp/rt --minutes 3 --size small

Stages (``--stages``, run in this order; each writes ``OUT/<stage>.json`` as soon as it
finishes, so a run cut short still returns what it measured):

corpus     every ``*.py`` under the corpus roots (default: the standard library and the
           site-packages folders), minus unreadable, generated-looking and duplicate
           files, split by FILE into train and held-out by a hash of the relative path
           (``stdlib/json/decoder.py``); ``WORK/manifest.json`` lists each file and split.
tokenizer  a byte-level BPE (``tokenizers``) trained on training files only; the corpus
           encoded to ``WORK/tokens/{train,heldout}.npy`` (one document per file, each
           followed by ``<|endoftext|>``).
pretrain   a ``Qwen3ForCausalLM`` from scratch for ``--minutes`` of training wall-clock
           (AdamW, warm-up + cosine on the clock, bf16 autocast on GPU, random windows of
           the training stream); saved with its tokenizer as the Hugging Face folder
           ``WORK/target`` (eos = pad = ``<|endoftext|>``, no chat template, spare
           embedding rows past the tokenizer, the first of which dflash takes as MASK).
heldout    ``WORK/target`` reloaded with AutoModelForCausalLM/AutoTokenizer: loss in
           nats/token, bits/byte and top-1 accuracy on tokens of held-out files (per
           corpus root, and on as many training tokens for the gap).
prompts    fixed-length code prefixes that end at a function signature's colon:
           ``WORK/prompts-eval.jsonl`` from held-out files, ``WORK/prompts-train.jsonl``
           from training files; rows ``{"prompt_ids": [...], "prompt": text, "source",
           "line", "reference"}`` (``dflash.data`` reads ``prompt_ids``; equal lengths so
           ``dflash-generate`` batches them). Also the target's greedy continuations of
           the eval prompts and the n-gram drafter's exact tau on them.

generate   ``dflash-generate``: the target's own greedy responses (``--gen-new-tokens``)
           to the first ``--gen-prompts`` TRAINING prompts, ``WORK/train-data.jsonl``
           (the paper's training data); also how repetitive they are and the n-gram
           drafter's exact tau on a sample of them.
probe      a short ``dflash-train`` run of the train stage's recipe (``--probe-steps``):
           its step time turns ``--drafter-seconds`` into a step count, and its export
           is the config of the untrained drafter the eval stage measures.
train      ``dflash-train``: a DFlash drafter (``--drafter-layers``, block 16, gamma 7,
           AdamW 6e-4 with 4 % warm-up and cosine to 0: the paper's recipe) on
           WORK/train-data.jsonl for the probed step count, checkpoints at 1/3 and 2/3 of
           it (each one a drafter folder ``dflash-eval`` reads), held-out tau in the
           metrics; a run that reaches ``--deadline-s`` is stopped by SIGTERM and keeps
           its checkpoint.
eval       ``dflash-eval`` on the held-out EVAL prompts, temperature 0, the same prompts,
           lengths and draft cap (15) for each of ``--eval-drafters``: ``ngram``,
           ``untrained`` (the trained drafter's config, fresh weights), ``trained``, and
           ``checkpoints`` (the train stage's intermediate checkpoints, on
           ``--checkpoint-prompts`` prompts). Results of an earlier process (another
           machine call on the same WORK) are kept: OUT/eval.json holds every drafter
           measured so far.

A later stage is one function ``(Run) -> dict`` added to ``STAGES``; :func:`run_cli`
runs a project command (``dflash-generate``, ``dflash-train``, ``dflash-eval``) as a
subprocess for such a stage. ``--stages`` can resume from a finished stage: each stage
reads what the earlier ones left in OUT and WORK (every stage result is also kept in
``WORK/results/``, so a later process with an empty OUT resumes too).

Three machine calls on one WORK, each within the machine's warm window after the last
(what was run for docs/bench/real-target/drafter-2/, run 2 of BENCHMARKS' "Drafter
quality"):

    python3 benchmarks/real_target.py --out $OUT --work /tmp/rt --size small \
        --minutes 7 --deadline-s 520 --reserve-s 70 \
        --stages corpus,tokenizer,pretrain,heldout,prompts
    python3 benchmarks/real_target.py --out $OUT --work /tmp/rt --size small \
        --stages generate,probe,train --gen-batch 1024 --deadline-s 510 \
        --train-reserve-s 20 --train-startup-s 40
    python3 benchmarks/real_target.py --out $OUT --work /tmp/rt --size small \
        --stages eval --eval-dtype float32 --deadline-s 455

Budget the eval stage first: eager batch-1 decoding of this target runs at about 100
tokens/s on the H200, so one drafter on 24 prompts x 192 tokens takes about 70 s
(target-only and speculative), an untrained one (tau 1) on 8 prompts about 55 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realtarget.cli import main

if __name__ == "__main__":
    sys.exit(main(description=__doc__.split("\n\n")[0] if __doc__ else ""))
