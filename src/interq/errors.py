"""The error a user can fix by changing a value: the base of interq's one-line refusals.

It lives at the bottom of the package so that every layer (the ``INTERQ_*`` switches read by the kernels, the
trainer's config) can raise it; :mod:`interq.train.config` re-exports it as ``interq.train.config.ConfigError``.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and what is accepted."""
