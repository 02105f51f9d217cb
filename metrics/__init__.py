"""Prometheus metrics for slotserve; the gateway uses `ServerMetrics` (see prom.py)."""

from .prom import ServerMetrics

__all__ = ["ServerMetrics"]
