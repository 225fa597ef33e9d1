"""Decoding with the frozen target: its own responses, the training data
(:mod:`.generate`), speculative decoding with a drafter (:mod:`.speculative`), and how a
speculative decoder compares with the target alone (:mod:`.evaluate`)."""
