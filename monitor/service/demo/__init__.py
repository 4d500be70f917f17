"""`infersight demo`: the whole loop on a laptop, no GPU (see script.py for the incident)."""

from __future__ import annotations

from .receiver import WebhookReceiver, new_secret, verify_signature
from .script import DemoOptions, DemoResult, run_demo
from .timeline import DemoFailed, Step

__all__ = [
    "DemoFailed",
    "DemoOptions",
    "DemoResult",
    "Step",
    "WebhookReceiver",
    "new_secret",
    "run_demo",
    "verify_signature",
]
