"""quantize."""
