"""`infersight demo`: the whole loop on a laptop, no GPU (see script.py for the incident)."""

from __future__ import annotations

from .models import MODELS, DemoModels
from .next_release import BuildQuality
from .script import DemoOptions, DemoResult, run_demo
from .stage import WebhookReceiver, new_secret, verify_signature
from .timeline import DemoFailed, Step

__all__ = [
    "MODELS",
    "BuildQuality",
    "DemoFailed",
    "DemoModels",
    "DemoOptions",
    "DemoResult",
    "Step",
    "WebhookReceiver",
    "new_secret",
    "run_demo",
    "verify_signature",
]
