"""The HTTP server of `flare run`."""
