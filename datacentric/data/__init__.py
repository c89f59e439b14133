"""datacentric.data."""
