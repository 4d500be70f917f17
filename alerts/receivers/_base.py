"""The receiver protocol and the table from receiver type to class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from ..matchers import ReceiverConfig
from ..notification import Notification
from ..transport import HttpRequest

__all__ = ["Receiver", "build_receiver", "build_receivers"]


@runtime_checkable
class Receiver(Protocol):
    config: ReceiverConfig

    def render(self, notification: Notification, *, sent_at: float) -> HttpRequest:
        """The HTTP request delivering `notification`; `sent_at` (epoch seconds) is this attempt's time."""
        ...


def build_receiver(config: ReceiverConfig) -> Receiver:
    from .pagerduty import PagerDutyReceiver
    from .slack import SlackReceiver
    from .webhook import WebhookReceiver

    kinds: dict[str, type[PagerDutyReceiver] | type[SlackReceiver] | type[WebhookReceiver]] = {
        "pagerduty": PagerDutyReceiver,
        "webhook": WebhookReceiver,
        "slack": SlackReceiver,
    }
    return kinds[config.type](config)


def build_receivers(configs: Mapping[str, ReceiverConfig]) -> dict[str, Receiver]:
    """Receivers for every enabled config."""
    return {name: build_receiver(c) for name, c in configs.items() if c.enabled}
