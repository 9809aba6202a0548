"""helios."""
