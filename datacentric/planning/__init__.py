"""datacentric.planning."""
