"""Profiling: measures the real runtime and fits cost models from it."""
