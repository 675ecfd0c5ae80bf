"""Language models: loading through mlx-lm, chat prompts, and generation (sampling, stop sequences,
tool calls) shared by chat completions and responses."""
