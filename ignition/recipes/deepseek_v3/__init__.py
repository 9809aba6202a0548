"""DeepSeek-V3 recipe."""
