"""envguard's version, in a module of its own so that any module may import it without
importing the package's public face (:mod:`envguard`)."""

__version__ = "0.1.0"
