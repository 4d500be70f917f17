"""One module per group of HTTP endpoints; each exposes `router` or a `build_router(...)`."""
