"""swama.tools."""
