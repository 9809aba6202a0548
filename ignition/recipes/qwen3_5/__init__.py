"""Qwen3.5 recipe."""
