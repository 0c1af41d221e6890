"""perfcast: predict LLM inference performance on accelerators, with provenance."""

__version__ = "0.1.0"
