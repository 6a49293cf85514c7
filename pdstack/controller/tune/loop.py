"""`pdstack tune` (`invoke tune`): find the fastest serving recipe that still recalls, on the deployment itself.

    1. Every candidate of the tune file is planned like an inventory (the inventory + its overlay as pdstack_tune,
       checked, planned and read back against the facts the last deploy recorded) before anything changes; the
       sweep is checked against the model's context and the front door's admission. One bad candidate: nothing runs.
       The run's estimate on the real host (estimate.py) is printed before anything changes.
    2. "baseline": the deployment as it runs, measured first (recall gate, accuracy gate, then the sweep).
    3. Each candidate: `ansible-playbook site.yml --tags facts,serving -e @overlay.json` (the rolling restart applies
       it: drain, restart, probe, back in; a topology candidate and the one after it also run the firewall, router,
       front door, monitoring and watchdog phases: TOPOLOGY_TAGS), then the recall gate (the smoke gate's grid and
       min_horizon; a candidate that loses recall is disqualified and not swept), then the accuracy gate
       (gates/accuracy.py: measurably below the baseline is disqualified, not swept), then the sweep (sweep.py:
       bench_serving's Rust client). A candidate whose servers do not come up within start_timeout_s is recorded as
       failed to start, and skipped.
    4. Always, also on Ctrl-C or a failure: the same playbook without the overlay (with TOPOLOGY_TAGS if a topology
       ran) restores the inventory's plan, and the restored plan is compared with the one the run started from.
    5. build/tune/<inventory>/<run>/: results.json, report.md, throughput.png, ttft.png, pareto.png, per candidate
       its playbook log, recall.json + heatmap, accuracy.json and bench_serving's JSONL; winner/ holds the host_vars
       change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pdstack.controller import pipeline
from pdstack.controller.gates import accuracy, apikey, heatmap, recall, results, smoke_settings
from pdstack.controller.load import inventory, tune_overlay
from pdstack.controller.load.facts import load_facts
from pdstack.controller.tune import estimate, report, settings, sweep
from pdstack.errors import InventoryError

ROOT = smoke_settings.ROOT
TAGS = "facts,serving"
# a topology candidate (and the run after one) changes the worker list, the ports, the scrape targets and the
# watchdog's server list too
TOPOLOGY_TAGS = "facts,firewall,serving,router,frontdoor,monitoring,watchdog"


def say(msg: str) -> None:
    print(f"[tune {datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


class Tuner:
    require_image = True  # the plans are about to be deployed (as the preflight role plans them)
    base_accuracy: dict[str, Any] | None = None  # the baseline's accuracy gate, what candidates are held against
    gpus: dict[str, int]  # GPUs of the baseline's and each candidate's plan (check() fills it)

    def __init__(self, inv: str, cfg: dict[str, Any], out: Path, url: str | None = None, root: Path = ROOT):
        self.inv, self.cfg, self.out, self.url = inv, cfg, out, url
        self.state = root / "build" / "state" / Path(inv).name
        self.hostvars, self.groups, self.locations = inventory.load_located(inv)
        self.facts = load_facts(self.state / "facts", list(self.hostvars))
        if sorted(self.facts) != sorted(self.hostvars):
            raise InventoryError([f"{self.state / 'facts'}: no recorded facts for "
                                  f"{', '.join(sorted(set(self.hostvars) - set(self.facts)))}; tune measures a "
                                  f"running deployment: deploy it first (invoke deploy -i {inv})"])
        self.base_dep = inventory.build_deployment(self.hostvars, self.groups, inv, self.locations)
        self.base_plan = pipeline.make_plan(self.base_dep, self.facts, require_image=self.require_image)

    # ------------------------------------------------------------------------------------------------ checks

    def overlay(self, cand: dict[str, Any]) -> dict[str, Any]:
        return {"name": cand["name"], "servers": cand["servers"],
                **({"index_k_dtype": cand["index_k_dtype"]} if cand.get("index_k_dtype") else {}),
                **({"topology": cand["topology"]} if cand.get("topology") else {})}

    def plan_of(self, cand: dict[str, Any] | None):
        hv = {h: {**v, **({"pdstack_tune": self.overlay(cand)} if cand else {})} for h, v in self.hostvars.items()}
        dep = inventory.build_deployment(hv, self.groups, self.inv, self.locations)
        return pipeline.make_plan(dep, self.facts, require_image=self.require_image), dep

    def check(self) -> None:
        """Every candidate planned, the sweep within the deployment's limits; raises listing every problem."""
        problems = []
        self.gpus = {"baseline": gpu_count(json.loads(self.base_plan.to_json()))}
        for cand in self.cfg["candidates"]:
            try:
                plan, _ = self.plan_of(cand)
                self.gpus[cand["name"]] = gpu_count(json.loads(plan.to_json()))
            except InventoryError as e:
                problems += [f"candidate {cand['name']}: {p}" for p in e.problems]
                continue
            problems += [f"candidate {cand['name']}: {p}" for p in estimate.admission_problems(
                json.loads(plan.to_json()), self.base_dep.router["admission"])]
        ctx = self.base_dep.model["context_length"]
        sw = self.cfg["sweep"]
        for s in sw["shapes"]:
            if s["input"] + s["output"] > ctx:
                problems.append(f"sweep.shapes: {s['input']}/{s['output']} needs {s['input'] + s['output']} tokens, "
                                f"over the model's context_length {ctx}; use shorter shapes for this inventory")
        problems += self.running_is_the_inventorys()
        tok = self.tokenizer()
        if not tok or not (Path(tok) / "tokenizer.json").is_file():
            problems.append(f"the recall gate's tokenizer {tok or '(none)'} has no tokenizer.json: the model phase "
                            f"copies the lock's tokenizer there on deploy (invoke deploy -i {self.inv}), or set "
                            "pdstack_smoke.tokenizer")
        adm = self.base_dep.router["admission"]
        if adm["max_concurrent_requests"] > 0:
            room = adm["max_concurrent_requests"] + adm["queue_size"]
            for c in sw["concurrency"]:
                if c > room:
                    problems.append(f"sweep.concurrency: {c} is more than the front door admits ("
                                    f"{adm['max_concurrent_requests']} in flight + {adm['queue_size']} queued, "
                                    "pdstack_router.admission): the rest would get 429; sweep within it")
        if problems:
            raise InventoryError(problems)

    def tokenizer(self) -> str | None:
        return smoke_settings.from_deployment(self.base_dep)["tokenizer"]

    def _servers(self, plan: dict[str, Any]) -> dict[str, tuple]:
        return {s["name"]: (s["host"], s["argv"], s["env"]) for s in plan["servers"]}

    def running_is_the_inventorys(self) -> list[str]:
        """The baseline is the inventory's plan: the last site.yml run (its preflight's build/state/<inv>/plan.json)
        must have planned exactly these servers, else the baseline would measure something else."""
        last = self.state / "plan.json"
        if not last.is_file():
            return [f"{last}: missing; tune measures a running deployment: deploy it first (invoke deploy -i "
                    f"{self.inv})"]
        last_plan, want_plan = json.loads(last.read_text()), json.loads(self.base_plan.to_json())
        out = []
        if (last_plan.get("image"), last_plan.get("image_id")) != (want_plan["image"], want_plan["image_id"]):
            out.append(f"{last}: the last site.yml run deployed image {last_plan.get('image')}, the inventory now "
                       f"plans {want_plan['image']} (a new build since?); every candidate would restart onto it: "
                       f"deploy it first (invoke deploy -i {self.inv})")
        now, want = self._servers(last_plan), self._servers(want_plan)
        differ = sorted(n for n in set(now) | set(want) if now.get(n) != want.get(n))
        if differ:
            out.append(f"{last}: the last site.yml run planned server(s) {', '.join(differ)} unlike the inventory "
                       "does now (extra vars, or an edit since); tune's baseline is the inventory's plan: deploy it "
                       f"first (invoke deploy -i {self.inv})")
        return out

    # ------------------------------------------------------------------------------------------ the deployment

    def router_url(self) -> str:
        """The front door as the controller reaches it: a container test host by its bridge address (as the smoke
        role asks Docker), else the plan's URL."""
        if self.url:
            return self.url.rstrip("/")
        r = self.base_plan.router
        host = str(self.hostvars.get(r.host, {}).get("ansible_host", r.host))
        if shutil.which("docker"):
            got = subprocess.run(["docker", "inspect", "--format",
                                  "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", host],
                                 capture_output=True, text=True, check=False)
            if got.returncode == 0 and got.stdout.split():
                return f"http://{got.stdout.split()[0]}:{r.port}"
        return r.url

    def playbook(self, cand: dict[str, Any] | None, log: Path, tags: str = TAGS) -> tuple[int, str]:
        """site.yml --tags `tags` with the candidate's overlay (None: without one). (rc, output tail)"""
        extra = {"serving_ready_timeout_s": self.cfg["start_timeout_s"]}
        if cand:
            extra["pdstack_tune"] = self.overlay(cand)
        log.parent.mkdir(parents=True, exist_ok=True)
        xfile = log.with_suffix(".vars.json")
        xfile.write_text(json.dumps(extra, indent=1) + "\n")
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "site.yml", "-i", self.inv, "--tags", tags,
               "-e", f"@{xfile}"]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONUNBUFFERED": "1", "ANSIBLE_NOCOLOR": "1"}
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            for line in proc.stdout:  # progress: the task names, as they run
                f.write(line)
                if line.startswith("TASK [serving : Serving | rolling restart") or line.startswith("fatal:"):
                    say("  " + line.strip()[:150])
            rc = proc.wait()
        return rc, failure(log.read_text()) if rc else ""

    # ------------------------------------------------------------------------------------------ measurement

    def measure(self, name: str, url: str, headers: dict[str, str], key: str | None) -> dict[str, Any]:
        smoke = smoke_settings.from_deployment(self.base_dep)
        d = self.out / name
        say(f"{name}: recall gate ({len(smoke['lengths'])} lengths x {len(smoke['depths'])} depths, min horizon "
            f"{smoke['min_horizon']})")
        say(f"{name}: {recall.estimate_line(smoke)}")
        rr = recall.run_with(url, smoke, headers=headers)
        results.write_json(d / "recall.json", rr.to_dict())
        heatmap.draw(rr, d / "recall.png")
        rec = {"passed": rr.passed, "horizon": rr.horizon(), "min_horizon": smoke["min_horizon"],
               "counts": rr.counts()}
        say(f"{name}: recall {'PASS' if rr.passed else 'FAIL'}, horizon {rec['horizon']} tokens")
        if not rr.passed:
            return {"status": "measured", "recall": rec, "points": []}
        acc = accuracy.run(url, self.base_dep.model["served_name"], headers=headers,
                           timeout=float(smoke["timeout"]))
        results.write_json(d / "accuracy.json", acc)
        say(f"{name}: accuracy {acc['correct']}/{acc['total']} ({acc['errors']} errors)")
        why = accuracy.verdict(acc, self.base_accuracy, self.cfg["accuracy_max_drop"])
        if name == "baseline":
            self.base_accuracy = acc
        acc = {k: v for k, v in acc.items() if k != "answers"}
        if why:
            say(f"{name}: disqualified: {why}; not swept")
            return {"status": "measured", "recall": rec, "accuracy": acc, "points": [], "disqualified_because": why}
        sw = self.cfg["sweep"]
        kw = {"tokenizer": smoke["tokenizer"], "model": self.base_dep.model["served_name"], "out_dir": d / "bench",
              "api_key": key}
        sweep.warm_up(url, sw["shapes"][0], sw["warmup_prompts"], sw["warmup_wait_s"], **kw)
        pts = []
        gpus = self.gpus.get(name, 0)
        for p in settings.points(sw):
            r = sweep.run_point(url, p, salt=zlib.crc32(name.encode()) % 100_000, **kw)
            r.update(report.derive(r, gpus, self.cfg["goodput_tpot_ms"]))
            say(f"{name}: in {p['input']} out {p['output']} C={p['concurrency']}: decode "
                f"{report.fixed(r['decode_tps_per_request_p50'])} tok/s/req, aggregate "
                f"{report.fixed(r['aggregate_tps'])} tok/s, TTFT p50 {report.fixed(r['ttft_ms_p50'])} ms, "
                f"errors {r['errors']}")
            pts.append(r)
        return {"status": "measured", "recall": rec, "accuracy": acc, "points": pts}

    # ------------------------------------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        self.check()
        url = self.router_url()
        key = apikey.load()
        headers = apikey.headers(key) if key else {}
        cands = self.cfg["candidates"]
        res: dict[str, Any] = {"inventory": self.inv, "run": self.out.name, "url": url,
                               "objective": self.cfg["objective"], "tpot_p99_ms_max": self.cfg["tpot_p99_ms_max"],
                               "goodput_tpot_ms": self.cfg["goodput_tpot_ms"], "skipped": self.cfg.get("skipped"),
                               "sweep": self.cfg["sweep"], "candidates": [], "winner": None, "restored": None}
        say(f"{self.inv}: baseline + {len(cands)} candidate(s) ({', '.join(c['name'] for c in cands)}) through "
            f"{url}; results in {self.out}" + (f"; skipped: {', '.join(self.cfg['skipped'])}"
                                               if self.cfg.get("skipped") else ""))
        res["estimate"] = est = estimate.run_estimate(self.cfg, smoke_settings.from_deployment(self.base_dep))
        for line in estimate.lines(est):
            say(line)
        t0 = time.monotonic()
        applied, wide, prev_topology = False, False, False
        try:
            base = {"name": "baseline", "description": "the plan as the inventory has it", "overlay": None,
                    "gpus": self.gpus["baseline"]}
            base.update(self.measure("baseline", url, headers, key))
            res["candidates"].append(base)
            for i, cand in enumerate(cands, 1):
                entry = {"name": cand["name"], "description": cand["description"], "status": "not measured "
                         "(the run stopped first)", "overlay": self.overlay(cand), "recall": None, "points": [],
                         "source": cand.get("source") or "", "gpus": self.gpus.get(cand["name"])}
                res["candidates"].append(entry)
                tags = TOPOLOGY_TAGS if cand.get("topology") or prev_topology else TAGS
                say(f"[{i}/{len(cands)}] {cand['name']}: applying (site.yml --tags {tags}, rolling restart)")
                applied, prev_topology = True, bool(cand.get("topology"))
                wide = wide or prev_topology
                rc, tail = self.playbook(cand, self.out / cand["name"] / "playbook.log", tags)
                if rc != 0:
                    entry.update(status="failed to start", error=f"site.yml rc {rc}: {tail}")
                    say(f"{cand['name']}: did not start (site.yml rc {rc}; {self.out / cand['name'] / 'playbook.log'})"
                        "; skipped")
                    continue
                entry.update(self.measure(cand["name"], url, headers, key))
        except KeyboardInterrupt:
            res["interrupted"] = True
            say("interrupted: restoring the inventory's plan (Ctrl-C again leaves it half-restored: then run "
                f"`invoke deploy -i {self.inv}`)")
        finally:
            if applied:
                tags = TOPOLOGY_TAGS if wide else TAGS
                say(f"restoring the inventory's plan (site.yml --tags {tags} without an overlay)")
                rc, tail = self.playbook(None, self.out / "restore" / "playbook.log", tags)
                res["restored"] = self.restored(rc, tail)
            else:
                res["restored"] = "nothing was changed"
            self.finish(res, time.monotonic() - t0)
        return res

    def restored(self, rc: int, tail: str) -> str:
        if rc != 0:
            return f"FAILED: site.yml rc {rc} ({self.out / 'restore' / 'playbook.log'}): {tail[-600:]}"
        same = not self.running_is_the_inventorys()
        return "yes: the servers run the inventory's plan again" if same else \
            "FAILED: the restored plan's servers differ from the plan the run started from"

    def finish(self, res: dict[str, Any], seconds: float) -> None:
        res["winner"] = report.pick_winner(res["candidates"], res["objective"], res["tpot_p99_ms_max"])
        res["seconds"] = round(seconds, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        pngs = report.plots(res, self.out)
        change = None
        if res["winner"] not in (None, "baseline"):
            win = next(c for c in self.cfg["candidates"] if c["name"] == res["winner"])
            # the inventory's own servers (as its files say, no defaults filled in) with the overlay merged
            merged, _ = tune_overlay.apply(self.overlay(win), self.hostvars, [])
            change = report.winner_change(res, {h: v["pdstack_servers"] for h, v in merged.items()
                                                if v.get("pdstack_servers")}, self.out)
        res["winner_change"] = str(change) if change else None
        results.write_json(self.out / "results.json", res)
        (self.out / "report.md").write_text(report.markdown(res, pngs, change))
        print("\n" + report.table(res))
        print(f"\nwinner ({res['objective']}): {res['winner'] or 'none qualified'}"
              + (f"; host_vars change: {change}" if change else ""))
        print(f"restored: {res['restored']}")
        print(f"report: {self.out / 'report.md'}; plots: {', '.join(str(p) for p in pngs)}; "
              f"results: {self.out / 'results.json'} ({seconds:.0f} s)")


def gpu_count(plan: dict[str, Any]) -> int:
    """The GPUs a plan's servers use (the per-GPU figures' denominator)."""
    return sum(len(s.get("gpus") or []) for s in plan.get("servers") or [])


def failure(output: str) -> str:
    """Why a playbook failed, from its output: the last `fatal:` result (the serving role's failure names the server
    and quotes its journal), up to the next task; else the output's tail."""
    cut = output.rfind("\nfatal:")
    if cut < 0:
        return "\n".join(output.splitlines()[-15:])
    block = output[cut + 1:]
    end = block.find("\nTASK [")
    return (block if end < 0 else block[:end]).strip()[:2000]


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--inventory", required=True, help="the deployed inventory to tune, e.g. inventory/local")
    p.add_argument("--tune", help="the tune file (default: <inventory>.tune.yml, beside the inventory)")
    p.add_argument("--objective", choices=settings.OBJECTIVES, help="what the winner maximises (default: the file's)")
    p.add_argument("--tpot-p99-ms-max", type=float, help="aggregate_tps: the TPOT p99 bound a point must meet")
    p.add_argument("--url", help="the front door's URL as this machine reaches it (default: from the plan)")
    p.add_argument("--out", help="results directory (default: build/tune/<inventory>/<UTC time>)")
    p.add_argument("--skip", action="append", default=[], metavar="NAME",
                   help="leave this candidate out (repeatable); the estimate and report say it was skipped")
    p.add_argument("--check", action="store_true", help="only plan every candidate and check the sweep; change "
                   "nothing")
    p.epilog = ("exit codes: 0 a winner, 1 no candidate qualified or the restore failed, 2 bad tune file or "
                "inventory. The API key (if the front door has one): PDSTACK_API_KEY_FILE or PDSTACK_API_KEY")


def run(args: argparse.Namespace) -> int:
    cfg = settings.load(args.tune or settings.default_path(args.inventory), args.objective, args.tpot_p99_ms_max,
                        args.skip)
    out = Path(args.out) if args.out else (ROOT / "build" / "tune" / Path(args.inventory).name
                                           / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    t = Tuner(args.inventory, cfg, out, args.url)
    if args.check:
        t.check()
        print(f"tune: {len(cfg['candidates'])} candidate(s) plan; {len(settings.points(cfg['sweep']))} point(s) "
              "per candidate; nothing changed")
        for line in estimate.lines(estimate.run_estimate(cfg, smoke_settings.from_deployment(t.base_dep))):
            print(line)
        return 0
    res = t.run()
    ok = res["winner"] is not None and str(res["restored"]).startswith(("yes", "nothing"))
    return 0 if ok else 1
