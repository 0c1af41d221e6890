"""Outputs: per-op tables, metrics JSON and Chrome traces."""
