"""YAML presets: the five arms (docs/algorithm.md) over the household defaults (see interq.train.config)."""
