"""datacentric.parallel."""
