"""Gemma 4 recipe."""
