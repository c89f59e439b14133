"""datacentric.cli."""
