"""engine/text."""
