"""Notifications, as Alertmanager's stages: routing, grouping and inhibition
(`routing.py`), silences (`silences.py`), the transactional outbox (`outbox.py`), the
receivers that turn a notification into an HTTP request (`receivers.py`), and delivery
with retries over the HTTP seam (`delivery.py`).

The public names are exported by `infersight.alerts`.
"""
