"""handlers/cli."""
