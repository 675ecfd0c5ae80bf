"""Builders of the models the tests run: tiny random-weight models of the real architectures."""
