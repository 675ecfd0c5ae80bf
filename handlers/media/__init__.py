"""handlers/media."""
