"""engine/files."""
