"""Monitoring from the plan: Prometheus scrape config, node_exporter textfile metrics, Grafana dashboards, and a
checker that evaluates every dashboard query against a real Prometheus.

The monitoring role calls `python -m pdstack.controller.render.monitoring ...` on the controller; tests call the
functions
directly.
"""
