"""Checks that a distributed step equals one process."""
