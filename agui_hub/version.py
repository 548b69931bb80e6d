"""The hub's version (one place: the package, the CLI and /metrics read it)."""

__version__ = "0.1.0"
