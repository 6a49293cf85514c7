"""Monitoring from the plan: Prometheus scrape config, node_exporter textfile metrics, Grafana dashboards, and a
checker that evaluates every dashboard query against a real Prometheus.

The monitoring role calls `python -m pdstack.controller.monitoring ...` on the controller; tests call the functions
directly.
"""

# Grafana names the role provisions and the dashboards refer to, defined once. The planner copies them into the plan
# (plan.monitoring.grafana), where the grafana role reads them.
DATASOURCE_UID = "pdstack-prometheus"
# Dashboards are provisioned into this folder, never General: anonymous viewers got 403 there (FACTS.md).
FOLDER = "sglang"
