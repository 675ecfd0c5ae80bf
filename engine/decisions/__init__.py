"""Decisions: the label scorer behind /v1/decisions, /v1/systemone and Clef (decide.py), logits at
chosen positions only (heads.py), decision checkpoints with their own head, and scorer/ (prompt
format, labels, checks and math, without MLX)."""
