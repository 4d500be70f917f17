"""Metrics read from the shared store at scrape time: firing alerts by name and severity,
outbox backlog and dead letters. Every replica would read the same figures, so only the
leader exports them (`leading`): a dashboard's `sum()` over instances counts each once."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["AlertStoreCollector"]

log = logging.getLogger(__name__)


class AlertStoreCollector(Collector):
    def __init__(self, db: Engine, *, leading: Callable[[], bool] = lambda: True) -> None:
        self.db = db
        self.leading = leading

    def collect(self) -> Iterator[Metric]:
        from infersight.monitor.store.tables import alerts, outbox

        if not self.leading():
            return

        firing = GaugeMetricFamily(
            "infersight_alerts_firing", "Alerts firing now", labels=["alertname", "severity"]
        )
        pending = GaugeMetricFamily("infersight_outbox_pending", "Notifications waiting to be delivered")
        dead = GaugeMetricFamily(
            "infersight_outbox_dead_letters", "Notifications that exhausted their retries"
        )
        try:
            with self.db.connect() as conn:
                rows = conn.execute(
                    select(alerts.c.alertname, alerts.c.labels).where(alerts.c.state == "firing")
                ).all()
                states: dict[str, int] = dict(
                    conn.execute(select(outbox.c.state, func.count()).group_by(outbox.c.state)).all()
                )
        except SQLAlchemyError as exc:  # a scrape never fails because the database is away
            log.warning("alert metrics unavailable: %s", exc)
            return
        counts = Counter((name, str(json.loads(labels).get("severity", ""))) for name, labels in rows)
        for (name, severity), n in sorted(counts.items()):
            firing.add_metric([name, severity], n)
        pending.add_metric([], states.get("pending", 0))
        dead.add_metric([], states.get("dead", 0))
        yield firing
        yield pending
        yield dead
