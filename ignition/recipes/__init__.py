"""recipes."""
