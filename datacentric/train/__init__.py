"""datacentric.train."""
