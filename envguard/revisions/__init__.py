"""Revisions: every change ``envguard install``, ``envguard undo`` and ``envguard restore
--in-place`` made to an environment (:mod:`.store`), and the way back (:mod:`.undo`)."""
