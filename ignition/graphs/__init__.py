"""Graph catalogs: static-shape prepared steps, compiled and captured."""
