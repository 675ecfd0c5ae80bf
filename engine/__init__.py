"""Everything that knows MLX and model files. The front end enters through engine/client.py only."""
