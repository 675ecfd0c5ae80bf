"""The swama command: one module per command; options.py makes the flags from the settings."""
