"""One process on one device: the base behaviour, nothing to wrap or synchronise."""

from __future__ import annotations

from .base import Strategy


class SingleDevice(Strategy):
    """Training in this process only."""
