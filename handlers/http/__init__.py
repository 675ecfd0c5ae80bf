"""handlers/http."""
