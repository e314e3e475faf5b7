"""transcoders: SAEs, per-layer and cross-layer transcoders; training, and loaders for other formats."""
