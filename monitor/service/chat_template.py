"""The chat template of the embedded runtime, documented because the demo model and any
user checkpoint without a template of its own are prompted with it:

    <role>: <content>\\n        one line per message, in order (system, user, assistant, ...)
    assistant:                  the model continues from here

Roles are written as given (`system`, `user`, `assistant`, `tool`, `function`, `developer`).
Upstream servers (proxy mode) apply their own template; this one is not used there.
"""

from __future__ import annotations

from collections.abc import Sequence

from .openai_schema import ChatMessage

__all__ = ["render_chat"]


def render_chat(messages: Sequence[ChatMessage]) -> str:
    lines = [f"{m.role}: {m.text()}" for m in messages]
    lines.append("assistant:")
    return "\n".join(lines)
