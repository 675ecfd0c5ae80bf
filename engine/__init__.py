"""swama.engine."""
