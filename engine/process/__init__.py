"""The engine in a process of its own: the server process keeps HTTP, templates, tokens to text and
SSE; the engine process drives the device (engine/process/core.py), behind the same door
(engine/client.py `EngineClient`, served by engine/process/proxy.py)."""
