"""The spec pipeline: pinned upstream documents -> specs/ -> generated/ (python -m tools.spec)."""
