"""A decode step traced once per shape and replayed: the batch's forward for the families served
most, over key/value storage of fixed capacity.

mlx-lm builds a decode step's graph in Python every token, one operation at a time, and cannot
compile it: its caches carry Python-int offsets that a trace would bake in. Here the rows live in
fixed slots of preallocated storage (`slots.SlotStore`) whose per-row lengths are arrays, so one
`mx.compile` trace serves every step of a (slots, capacity) shape; the projections that read the
same input are fused into one matmul at load (`fusion.py`); `forward.Decoder` is the traced
step; `batch.SlotBatch` is the generation batch that uses it. docs/architecture.md says which rows
and models take it and which keep mlx-lm's forward.
"""
