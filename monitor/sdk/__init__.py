"""infersight.monitor.sdk: the `@track` decorator that wraps a user's own inference call.

```python
from infersight.monitor import track, configure, default_monitor
from infersight.monitor.sdk import HttpSink

configure(sink=HttpSink("http://127.0.0.1:8000/api/v1/events", token="..."), sample_rate=0.05)

@track(model="fraud-triage", model_version="v3")
async def answer(prompt: str) -> str: ...

default_monitor().serve_metrics(port=9400)     # /metrics, without the sidecar
```

`feedback(request_id, score=...)` (or `thumbs="up"`, `rating=4`): a user's feedback on an
answer, by its id, sent like the records (non-blocking, never raising).

Sync functions, coroutines, generators and async generators; also `with track(...) as
call:`. Latency, TTFT, TPOT, tokens, in-flight and errors go to the monitor's
InferenceStats (Prometheus + sliding-window sketches); a sample of calls, with their
prompt and response text (truncated, optionally redacted), is delivered in batches to
the sink from a background thread. The decorator never raises an exception of its own
into the call; the user's exceptions are re-raised unchanged.
"""

from ._config import SDKConfig, SDKConfigError, SDKError, Sink, SinkError, SinkRejected, SinkUnavailable
from ._monitor import Monitor, configure, default_monitor, feedback, track
from ._outbox import HttpSink
from ._tracker import Call

__all__ = [
    "Call",
    "HttpSink",
    "Monitor",
    "SDKConfig",
    "SDKConfigError",
    "SDKError",
    "Sink",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "configure",
    "default_monitor",
    "feedback",
    "track",
]
