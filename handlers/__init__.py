"""swama.handlers."""
