"""The export side's fault injection; the settings themselves are ``core.transfer_faults``
(plain data the control plane hands the replicas without importing the transfer layer)."""

from __future__ import annotations

from core.transfer_faults import FaultInjection

__all__ = ["FaultInjection"]
