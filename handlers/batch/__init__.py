"""Durable batch jobs: the store of files and jobs (SQLite), what an input file must be, and the runner."""
