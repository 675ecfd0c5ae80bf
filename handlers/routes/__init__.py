"""handlers/routes."""
