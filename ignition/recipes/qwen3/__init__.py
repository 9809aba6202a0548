"""Qwen3 recipe."""
