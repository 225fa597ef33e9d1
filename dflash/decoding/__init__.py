"""Decoding with the frozen target: its own responses, the training data
(:mod:`.generate`), speculative decoding with a drafter (:mod:`.speculative`;
:mod:`.cycle` for every drafter, prompt lookup and the hybrid, on dynamic caches or on
the fixed shapes of :mod:`.static`, captured in CUDA graphs on a GPU), and how a
speculative decoder compares with the target alone (:mod:`.evaluate`)."""
