"""engine/serving."""
