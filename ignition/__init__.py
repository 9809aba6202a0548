"""ignition."""
