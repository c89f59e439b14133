"""datacentric.models."""
