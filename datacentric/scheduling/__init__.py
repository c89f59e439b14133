"""datacentric.scheduling."""
