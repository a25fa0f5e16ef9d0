"""collective."""
