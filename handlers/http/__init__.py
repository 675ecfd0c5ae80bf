"""What every route shares: the request pipeline, body and form reading, strict JSON, error envelopes,
the server's settings, the app with /openapi.json, /metrics, /health and the playground."""
