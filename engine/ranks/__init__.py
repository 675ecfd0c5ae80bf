"""One model split across ranks: processes that each hold a shard of the weights (mlx-lm's tensor or
pipeline sharding) and run the same scheduler steps, over MLX's distributed runtime.

- group.py: this process's place in the group; each step's plan shared from rank 0, every wait bounded.
- sharding.py: which split a model takes (tensor, pipeline) and the refusal for one that has none.

What one scheduler step holds, as rank 0 shares it, is the scheduler's: serving/turn.py.
"""
