"""The package version (read by run directories' `_run` block, `esft --version` and the environment report)."""

__version__ = "0.1.0"
