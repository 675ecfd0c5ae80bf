"""Serving past one process: one model split across ranks (ranks.py, over MLX distributed and
mlx.launch) and copies of the engine behind one endpoint (replicas.py, on Ray Serve)."""
