"""The engine behind the door: the pool that loads and admits, the loaders by kind, one batch
scheduler thread per language model, the prompt cache, and the parked threads MLX work runs on."""
