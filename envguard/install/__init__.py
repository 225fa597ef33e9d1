"""``envguard install``: an installer command predicted on a scratch copy of the environment
(:mod:`.command`, :mod:`.scratch`, :mod:`.predict`, :mod:`.locks`), then run and checked
against the prediction (:mod:`.apply`); the shell hook that routes installs here
(:mod:`.hook`)."""
