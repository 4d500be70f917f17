"""The drift job's trigger: texts recorded per version, counted incrementally.

Each drift tick asks how many texts each version has recorded since its last verdict. That
count is kept from the rows added since the previous tick (a primary-key range), not
recounted over the lookback window: the figures must match a full recount.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from _service_support import auth, config, event, running
from infersight.monitor.service.config import DriftConfig, ScheduleConfig
from infersight.monitor.store.tables import requests
from sqlalchemy import func, select

V1, V2 = "mixtral_banking_fp32-v1.0", "mixtral_banking_int8-v1.1"


def _recount(app) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    r = requests.c
    with app.state.service.db.connect() as conn:
        rows = conn.execute(
            select(r.model, r.model_version, func.count())
            .where(r.prompt.is_not(None))
            .group_by(r.model, r.model_version)
            .order_by(r.model, r.model_version)
        ).all()
    return [(m, v, int(n)) for m, v, n in rows]


def test_text_counts_per_version_match_a_full_recount_tick_after_tick(tmp_path: Path) -> None:
    quiet = ScheduleConfig(drift_s=3600.0, embed_s=3600.0, timeseries_s=0.2)  # the test runs the ticks
    cfg = dataclasses.replace(config(tmp_path), drift=DriftConfig(enabled=True), schedule=quiet)
    with running(cfg) as (app, client):
        wiring = app.state.service.parts.drift
        since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=24)

        def send(start: int, n: int, version: str, with_text: int) -> None:
            events = [
                event(start + i, model_version=version, **({"prompt": f"q{i}"} if i < with_text else {}))
                for i in range(n)
            ]
            assert (
                client.post("/api/v1/events", json={"events": events}, headers=auth()).json()["accepted"] == n
            )

        assert wiring.versions.active(since) == []
        send(0, 40, V1, with_text=30)
        assert wiring.versions.active(since) == _recount(app) == [("mixtral_banking", V1, 30)]
        assert wiring.versions.active(since) == [("mixtral_banking", V1, 30)]  # nothing new: unchanged
        send(100, 25, V2, with_text=5)
        send(200, 10, V1, with_text=10)
        assert (
            wiring.versions.active(since)
            == _recount(app)
            == [
                ("mixtral_banking", V1, 40),
                ("mixtral_banking", V2, 5),
            ]
        )
