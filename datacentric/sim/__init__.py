"""datacentric.sim."""
