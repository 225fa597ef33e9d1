"""Several processes under torchrun: the ranks of a launch (:mod:`.world`) and split roles,
the target on its own ranks streaming features to the drafter ranks (:mod:`.roles`)."""
