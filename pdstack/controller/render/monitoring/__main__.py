"""python -m pdstack.controller.render.monitoring COMMAND: what the monitoring role runs on the controller; the
dashboard writer.

  prometheus-config --plan FILE|- [--host NAME=ADDRESS ...] [--gpu|--no-gpu] [--scrape-interval 15s]
  textfile --plan FILE|- --host NAME [--facts FILE|-]
  dashboards [--check] [--out DIR]
  check-queries --prometheus URL [--dashboard FILE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from pdstack.controller.render.monitoring import dashboards, queries, scrape


def _load(path: str) -> dict:
    return json.loads(sys.stdin.read() if path == "-" else Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdstack.controller.render.monitoring", allow_abbrev=False)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pc = sub.add_parser("prometheus-config", help="prometheus.yml from the plan")
    pc.add_argument("--plan", required=True)
    pc.add_argument("--host", action="append", default=[], metavar="NAME=ADDRESS")
    pc.add_argument("--gpu", action=argparse.BooleanOptionalAction, default=None)
    pc.add_argument("--scrape-interval", default="15s")
    pc.add_argument("--evaluation-interval", default="15s")
    pc.add_argument("--node-exporter-port", type=int, default=scrape.NODE_EXPORTER_PORT)
    pc.add_argument("--dcgm-port", type=int, default=scrape.DCGM_EXPORTER_PORT)
    pc.add_argument("--prometheus-target", default="127.0.0.1:9090")
    tf = sub.add_parser("textfile", help="node_exporter textfile metrics (pdstack.prom) for one host")
    tf.add_argument("--plan", required=True)
    tf.add_argument("--host", required=True)
    tf.add_argument("--facts")
    db = sub.add_parser("dashboards", help="write monitoring/dashboards/*.json (--check: compare only)")
    db.add_argument("--check", action="store_true")
    db.add_argument("--out", type=Path, default=dashboards.DASHBOARD_DIR)
    cq = sub.add_parser("check-queries", help="every dashboard query must return series")
    cq.add_argument("--prometheus", required=True)
    cq.add_argument("--dashboard", action="append", type=Path)
    a = ap.parse_args(argv)

    if a.cmd == "prometheus-config":
        hosts = dict(h.split("=", 1) for h in a.host)
        cfg = scrape.prometheus_config(_load(a.plan), hosts=hosts, gpu=a.gpu, scrape_interval=a.scrape_interval,
                                       evaluation_interval=a.evaluation_interval,
                                       node_exporter_port=a.node_exporter_port, dcgm_port=a.dcgm_port,
                                       prometheus_target=a.prometheus_target)
        sys.stdout.write(yaml.safe_dump(cfg, sort_keys=False))
    elif a.cmd == "textfile":
        facts = _load(a.facts) if a.facts else None
        sys.stdout.write(scrape.textfile_metrics(_load(a.plan), a.host, facts))
    elif a.cmd == "dashboards":
        stale = [d.uid for d in dashboards.DASHBOARDS
                 if not (a.out / f"{d.uid}.json").exists() or (a.out / f"{d.uid}.json").read_text()
                 != dashboards.render(d)]
        if a.check:
            if stale:
                print(f"stale dashboards: {', '.join(stale)}; run python -m "
                      "pdstack.controller.render.monitoring dashboards",
                      file=sys.stderr)
                return 1
            return 0
        for p in dashboards.write_all(a.out):
            print(p)
    elif a.cmd == "check-queries":
        files = a.dashboard or sorted(dashboards.DASHBOARD_DIR.glob("*.json"))
        bad = queries.empty_queries(a.prometheus, [q for f in files for q in queries.dashboard_queries(f)])
        for q in bad:
            print(f"no series: {q}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
