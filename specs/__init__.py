"""swama.specs."""
