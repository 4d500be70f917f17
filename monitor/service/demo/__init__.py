"""`infersight demo`: the whole loop on a laptop, no GPU (see script.py for the incident)."""

from __future__ import annotations

from .script import DemoFailed, DemoOptions, DemoResult, Step, run_demo
from .stage import WebhookReceiver, new_secret, verify_signature

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
