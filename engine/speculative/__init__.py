"""Speculative decoding in the batch: drafting (prompt lookup), verification in one batched pass,
per-row key/value rollback, and the policy that decides when drafting pays."""
