"""Isolated trials: `runner` (parent side) starts `worker` (child side) in its own process group."""
