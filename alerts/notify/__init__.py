"""Notifications, as Alertmanager's stages: label matchers and what is built of them
(receivers' config, the route tree, inhibit rules, silences: `matchers.py`), routing and
grouping (`routing.py`), the transactional outbox (`outbox.py`), and the receivers that
turn a notification into an HTTP request, with the delivery of the outbox to them, retried
over the HTTP seam (`receivers.py`).

The public names are exported by `infersight.alerts`.
"""
