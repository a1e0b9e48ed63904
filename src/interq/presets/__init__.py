"""YAML presets: the five arms of interq-spec.md §4 over the household defaults (see interq.train.config)."""
