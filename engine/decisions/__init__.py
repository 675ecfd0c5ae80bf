"""engine/decisions."""
