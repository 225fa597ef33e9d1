"""Decoding with the frozen target: its own responses, the training data
(:mod:`.generate`), and speculative decoding with a drafter (:mod:`.speculative`)."""
