"""infersight's monitor: the SDK decorator, drift scoring, storage, scheduling, HTTP API and CLI."""
