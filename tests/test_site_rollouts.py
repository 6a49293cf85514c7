"""Rolling restarts for real: inventory/test/two-decode (prefill, two decodes, router, front door on one systemd
test host, pdstack-roll-1) deployed by site.yml with the sim TEST ENGINE, the real sglang-router and Debian's HAProxy.

A second run changes nothing and check mode restarts nothing; a changed environment restarts both decodes one at a
time under steady load through the front door (each drained out of the router first, never both out at once) and no
request fails; a restart of the only prefill turns the front door's maintenance switch on (503 + Retry-After at once)
and the requests in flight finish. Its host has a prefix of its own (pdstack-roll), so this file runs on one worker
beside tests/test_site.py on the other (pyproject.toml's pdstack_shared_host_tests). Slow: CI runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import yaml
from site_helpers import (
    BIN,
    ROOT,
    booted_hosts,
    changed_tasks,
    completion,
    container_id,
    playbook,
    recap,
    saved_sim_image,
    sh,
)

# pyproject.toml's pdstack_shared_host_tests lists this file: one xdist worker runs every test of the pdstack-roll-N
# host, in file order (pdstack/testing/parallel.py)
pytestmark = pytest.mark.slow

PREFIX = "pdstack-roll"  # inventory/test/two-decode names this host


@pytest.fixture(scope="module")
def hosts():
    """pdstack-roll-1 booted (and the sim image saved where inventory/test points), removed at the end."""
    saved_sim_image()
    yield from booted_hosts(PREFIX, 1)


TWO = ROOT / "inventory" / "test" / "two-decode"
# A poller inside the host: every 0.2 s, the router's workers (it listens on the host's 127.0.0.1) and each server's
# /_sim/state (received requests, running, start time), one JSON line each, until its stdout goes away.
POLLER = r"""
import json, sys, time, urllib.request
servers = json.loads(sys.argv[1])
while True:
    row = {"t": time.time()}
    try:
        with urllib.request.urlopen("http://127.0.0.1:8001/workers", timeout=2) as r:
            row["router"] = sorted(w["url"] for w in json.load(r)["workers"])
    except Exception:
        row["router"] = None
    for name, port in servers.items():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sim/state", timeout=2) as r:
                st = json.load(r)
            row[name] = [st["received"], st["running"], st["started_at"]]
        except Exception:
            row[name] = None
    print(json.dumps(row), flush=True)
    time.sleep(0.2)
"""


class HostPoller:
    def __init__(self, host: str, servers: dict[str, int]):
        self.proc = subprocess.Popen(["docker", "exec", "-i", host, "python3", "-u", "-c", POLLER, json.dumps(servers)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.rows: list[dict] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.rows.append(json.loads(line))

    def stop(self) -> list[dict]:
        self.proc.terminate()
        self.proc.wait(10)
        self._t.join(10)
        return self.rows


class SteadyLoad:
    """`clients` threads sending requests through the front door back to back (half streamed), each result kept."""

    def __init__(self, router: str, clients: int = 4, tokens: int = 48):
        from pdstack.testing.admission import request

        self.results: list[dict] = []
        self._stop = threading.Event()

        def loop(stream: bool) -> None:
            while not self._stop.is_set():
                t0 = time.time()
                r = request(router, tokens, stream=stream, timeout=120)
                self.results.append({**r, "stream": stream, "t0": t0})
                if r["status"] != 200:  # a client told to retry waits a little (not Retry-After: the test counts)
                    self._stop.wait(0.2)

        self._threads = [threading.Thread(target=loop, args=(i % 2 == 1,), daemon=True) for i in range(clients)]
        for t in self._threads:
            t.start()

    def stop(self) -> list[dict]:
        self._stop.set()
        for t in self._threads:
            t.join(150)
        return self.results


def watchdog_runs_since(host: str, t0: float) -> list[str]:
    """What the deployed watchdog (5 s timer on the test layouts) logged since t0 (pdstack/hostside/watchdog.py)."""
    r = sh(host, "journalctl", "-t", "pdstack-watchdog", "--since", f"@{int(t0)}", "-o", "cat", "--no-pager")
    assert r.returncode == 0, r.stderr
    return [x for x in r.stdout.splitlines() if x.strip()]


def assert_the_watchdog_held_still(host: str, t0: float) -> None:
    """A rolling restart holds the watchdog (roles/serving: drain.py mode --hold-*, then finish): during it no run
    probed or restarted. Without the hold its probes failed while the only prefill was down (the router's 502), and
    two failures in a row (K=2 here) restart the decodes, then the prefill, behind the rollout's back."""
    lines = watchdog_runs_since(host, t0)
    assert any("held for" in x and "rolling restart of" in x for x in lines), lines[-20:]
    assert not [x for x in lines if "probe failed" in x or "restarting" in x], lines[-20:]


def _servers_with_env(edit: dict[str, dict]) -> str:
    servers = yaml.safe_load((TWO / "host_vars/pdstack-roll-1/servers.yml").read_text())["pdstack_servers"]
    for s in servers:
        s["env"] = {**s.get("env", {}), **edit.get(s["name"], {})}
    return json.dumps({"pdstack_servers": servers})


@pytest.fixture(scope="module")
def two_decode(hosts):
    """inventory/test/two-decode deployed on pdstack-roll-1 (prefill, decode-0, decode-1, router, front door)."""
    r = playbook(TWO)
    assert r.returncode == 0, r.stdout[-6000:]
    return f"http://{hosts['pdstack-roll-1']}:8000"


def _cmd(host: str, name: str) -> list[str]:
    r = sh(host, "docker", "inspect", "--format", "{{json .Args}}", f"pdstack-{name}")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _units_ports_workers(host: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """What a tune run must leave as it found it: the server units, the listening ports, the router's workers, the
    servers the watchdog probes."""
    units = sh(host, "sh", "-c", "ls /etc/systemd/system/ | grep '^pdstack-server-' | sort").stdout.split()
    ports = sorted(set(sh(host, "sh", "-c", "ss -ltnH | awk '{print $4}'").stdout.split()))
    r = sh(host, "python3", "-c", "import urllib.request; print(urllib.request.urlopen("
           "'http://127.0.0.1:8001/workers').read().decode())")
    workers = sorted(w["url"] for w in json.loads(r.stdout)["workers"])
    watched = sorted(s["unit"] for s in json.loads(sh(host, "cat", "/etc/pdstack/watchdog.json").stdout)["servers"])
    return units, ports, workers, watched


def test_tune_picks_the_fastest_that_recalls_skips_what_breaks_and_restores_the_plan(two_decode, tmp_path):
    """`pdstack tune` (what `invoke tune` runs) with inventory/test/two-decode.tune.yml: each candidate applied by the
    rolling restart, gated by recall and by the accuracy gate, swept by SGLang's bench client through the front door.
    The sim's speed model (pdstack/testing/sim/speed.py) makes fp8-kv fast and collapses its recall: disqualified,
    never swept; greedy-memory never starts: recorded with its journal and skipped; spec-wrong-answers is the fastest
    and keeps recall but answers the quiz worse: disqualified by accuracy; one-decode-tp2 (a topology candidate)
    runs one TP2 decode where the inventory has two: decode-1's unit goes and the router serves one decode, at the
    TP2 speed; upstream-recipe wins at the modelled speed; then the inventory's plan runs again with the exact units,
    ports and router workers it had (the next test's second run also changes nothing). First in this file: the
    baseline is the inventory's plan, as the deploy left it."""
    host = "pdstack-roll-1"
    before = {n: _cmd(host, n) for n in ("prefill-0", "decode-0", "decode-1")}
    found = _units_ports_workers(host)
    assert "pdstack-server-decode-1.service" in found[0] and len(found[2]) == 3, found
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "pdstack", "tune", "-i", str(TWO), "--out", str(out), "--skip",
                        "greedy-memory-not-here"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    assert r.returncode == 2 and "--skip greedy-memory-not-here: no such candidate" in r.stderr + r.stdout, r
    r = subprocess.run([sys.executable, "-m", "pdstack", "tune", "-i", str(TWO), "--out", str(out)], cwd=ROOT,
                       env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}, capture_output=True,
                       text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout[-6000:], r.stderr[-3000:])
    res = json.loads((out / "results.json").read_text())
    by = {c["name"]: c for c in res["candidates"]}
    assert list(by) == ["baseline", "fp8-kv", "greedy-memory", "spec-wrong-answers", "one-decode-tp2",
                        "upstream-recipe"]
    assert res["winner"] == "upstream-recipe" and "winner (c1_decode_tps): upstream-recipe" in r.stdout
    # the whole run's estimate came first, before anything changed
    assert r.stdout.index("estimate: baseline") < r.stdout.index("[1/5] fp8-kv: applying")
    assert res["estimate"]["per_candidate"]["restart_s"] == 20
    # recall decides before speed: the fastest candidate lost recall, so it was not swept and cannot win
    assert by["fp8-kv"]["recall"]["passed"] is False and by["fp8-kv"]["recall"]["horizon"] < 4000
    assert by["fp8-kv"]["points"] == [] and by["fp8-kv"]["disqualified_because"].startswith("lost recall")
    assert by["greedy-memory"]["status"] == "failed to start"
    assert "did not answer /health" in by["greedy-memory"]["error"], by["greedy-memory"]["error"]
    assert "CUDA out of memory" in by["greedy-memory"]["error"], by["greedy-memory"]["error"]
    # answers decide too: recall kept, half the quiz wrong (the engine's fault on its servers), not swept
    base_acc, spec = by["baseline"]["accuracy"], by["spec-wrong-answers"]
    assert base_acc["correct"] == base_acc["total"] == 20 and base_acc["errors"] == 0, base_acc
    assert spec["recall"]["passed"] is True and spec["accuracy"]["correct"] <= 15, spec["accuracy"]
    assert spec["disqualified_because"].startswith("lost accuracy") and spec["points"] == [], spec
    # the topology candidate: decode-1 stopped and removed, one TP2 decode served (x 1.6 in the speed model)
    topo = by["one-decode-tp2"]
    log = (out / "one-decode-tp2" / "playbook.log").read_text()
    assert "Serving | stop pdstack-server-decode-1.service" in log and "--tags facts,firewall,serving,router" in log
    assert topo["qualified"] and topo["accuracy"]["correct"] == 20, topo
    assert topo["score"] == pytest.approx(64.0 * 1.6, rel=0.15), topo["score"]
    # the figures are the speed model's: 64 tok/s as deployed, x 1.45 (marlin) x 1.3 (batch within the graphs)
    c1 = {n: by[n]["score"] for n in ("baseline", "upstream-recipe")}
    assert c1["baseline"] == pytest.approx(64.0, rel=0.15), c1
    assert c1["upstream-recipe"] == pytest.approx(64.0 * 1.45 * 1.3, rel=0.15), c1
    for name in ("baseline", "one-decode-tp2", "upstream-recipe"):
        assert [(p["concurrency"], p["errors"]) for p in by[name]["points"]] == [(1, 0), (4, 0)], by[name]
        assert all(p["aggregate_tps"] and p["ttft_ms_p99"] and p["prefill_tps"] for p in by[name]["points"])
        assert all(p["tps_per_gpu"] == pytest.approx(p["aggregate_tps"] / 3, rel=0.01) for p in by[name]["points"])
    assert res["restored"].startswith("yes"), res["restored"]
    # the original plan runs again: the same container arguments, units, ports and router workers as before
    assert {n: _cmd(host, n) for n in before} == before
    assert not any("marlin" in " ".join(a) for a in before.values())
    assert _units_ports_workers(host) == found
    report = (out / "report.md").read_text()
    assert "Winner: **upstream-recipe**" in report and (out / "throughput.png").stat().st_size > 1000
    assert "## The cookbook's shape" in report and (out / "pareto.png").stat().st_size > 1000
    assert "| spec-wrong-answers | out: lost accuracy" in report
    winner = yaml.safe_load((out / "winner" / "host_vars" / host / "servers.yml").read_text())["pdstack_servers"]
    assert {s["name"]: s.get("extra_args", {}).get("moe-runner-backend") for s in winner} == {
        "prefill-0": None, "decode-0": "marlin", "decode-1": "marlin"}


def test_rollout_runs_are_idempotent_and_check_mode_restarts_nothing(two_decode):
    """After the deploy (and tune's restore above): a second run changes nothing and restarts nothing (the router
    role's worker check, the front door's maintenance file, the probe copy); check mode with a changed server
    restarts nothing either."""
    host = "pdstack-roll-1"
    ids = {n: container_id(host, f"pdstack-{n}") for n in ("prefill-0", "decode-0", "decode-1")}
    again = playbook(TWO)
    assert again.returncode == 0, again.stdout[-4000:]
    assert all(x["changed"] == 0 for x in recap(again.stdout).values()), changed_tasks(again.stdout)
    changed = _servers_with_env({"decode-1": {"ROLLOUT_TEST": "2"}})
    check = playbook(TWO, "--check", "-e", changed)
    assert check.returncode == 0, check.stdout[-4000:]
    assert "a run would drain and restart it" in check.stdout
    assert {n: container_id(host, f"pdstack-{n}") for n in ids} == ids  # nothing restarted by either
    # every worker of the plan is in the router
    r = sh(host, "python3", "-c", "import urllib.request; print(urllib.request.urlopen("
           "'http://127.0.0.1:8001/workers').read().decode())")
    listed = {w["url"] for w in json.loads(r.stdout)["workers"]}
    assert listed == {"http://pdstack-roll-1:30000", "http://pdstack-roll-1:30001",
                      "http://pdstack-roll-1:30002"}


def test_rolling_restart_of_two_decodes_under_steady_load_fails_no_request(two_decode):
    host, ports = "pdstack-roll-1", {"prefill-0": 30000, "decode-0": 30001, "decode-1": 30002}
    urls = {n: f"http://pdstack-roll-1:{p}" for n, p in ports.items()}
    before = {n: container_id(host, f"pdstack-{n}") for n in ("decode-0", "decode-1", "prefill-0")}
    poller = HostPoller(host, ports)
    load = SteadyLoad(two_decode)
    time.sleep(3)
    t0 = time.time()
    r = playbook(TWO, "--tags", "serving", "-e", _servers_with_env({"decode-0": {"ROLLOUT_TEST": "1"},
                                                                       "decode-1": {"ROLLOUT_TEST": "1"}}))
    took = time.time() - t0
    time.sleep(3)
    results, rows = load.stop(), poller.stop()
    assert r.returncode == 0, r.stdout[-6000:]
    assert_the_watchdog_held_still(host, t0)
    after = {n: container_id(host, f"pdstack-{n}") for n in before}
    # both decodes really restarted (new containers), the prefill did not
    assert after["decode-0"] != before["decode-0"] and after["decode-1"] != before["decode-1"], (before, after)
    assert after["prefill-0"] == before["prefill-0"]
    # no request failed: every one through the front door answered 200, streams ended with [DONE]
    bad = [x for x in results if x["status"] != 200 or (x["stream"] and "[DONE]" not in x["tail"])]
    during = [x for x in results if t0 <= x["t0"] <= t0 + took]
    assert not bad and len(during) > 20, (len(results), len(during), bad[:5])
    # never both decodes out of the router (or down) at once, and each was out while it restarted
    assert rows and all(x["router"] is not None for x in rows), "the router stopped answering"
    outs: dict[str, list[dict]] = {}
    for row in rows:
        out = [n for n in ("decode-0", "decode-1") if urls[n] not in row["router"] or row[n] is None]
        assert len(out) <= 1, row
        for n in out:
            outs.setdefault(n, []).append(row)
    assert set(outs) == {"decode-0", "decode-1"}, "a decode was never taken out of the router"
    for n in ("decode-0", "decode-1"):
        old_start = next(x[n][2] for x in rows if x[n] is not None)
        out_rows = outs[n]
        old = [x for x in out_rows if x[n] is not None and x[n][2] == old_start]  # out of the router, not restarted
        assert old, f"{n}: no sample between its removal and its restart"
        # drained: no new request reached it while it was out (a request routed just before the removal may still
        # arrive within the first 0.5 s), and its running requests went to 0 before it stopped
        settled = [x for x in old if x["t"] >= old[0]["t"] + 0.5]
        assert len({x[n][0] for x in settled}) <= 1, [(round(x["t"] - t0, 1), x[n]) for x in old]
        assert old[-1][n][1] == 0, old[-1]
        new_start = [x[n][2] for x in rows if x[n] is not None and x[n][2] != old_start]
        assert new_start, f"{n}: no new process seen"
        print(f"{n}: out of the router {out_rows[-1]['t'] - out_rows[0]['t']:.1f} s "
              f"(old process drained for {old[-1]['t'] - old[0]['t']:.1f} s)")
    print(f"rolling restart of two decodes under load: {len(during)} requests during the {took:.0f} s run, "
          f"{len(results)} in all, 0 failed")


def test_restart_of_the_only_prefill_refuses_new_requests_with_503_and_loses_none_in_flight(two_decode):
    from pdstack.testing.admission import request

    host = "pdstack-roll-1"
    before = container_id(host, "pdstack-prefill-0")
    long_streams: list[dict] = []
    holders = [threading.Thread(target=lambda: long_streams.append(request(two_decode, 64 * 6, stream=True,
                                                                           timeout=120))) for _ in range(2)]
    for t in holders:
        t.start()
    time.sleep(1)
    load = SteadyLoad(two_decode, clients=3, tokens=16)
    t0 = time.time()
    # only the prefill's environment changes (the decodes keep the previous test's; KV-related env such as
    # PDSTACK_* must agree between prefill and decode, preflight says, so the test uses an unrelated name)
    r = playbook(TWO, "--tags", "serving", "-e", _servers_with_env({n: {"ROLLOUT_TEST": "1"} for n in
                                                                       ("prefill-0", "decode-0", "decode-1")}))
    took = time.time() - t0
    for t in holders:
        t.join(120)
    time.sleep(2)
    results = load.stop()
    assert r.returncode == 0, r.stdout[-6000:]
    assert container_id(host, "pdstack-prefill-0") != before
    assert_the_watchdog_held_still(host, t0)
    # in flight when the switch went on: they finished (the drain waits for the front door's in-flight requests)
    assert [x["status"] for x in long_streams] == [200, 200], long_streams
    assert all(x["tail"].rstrip().endswith("data: [DONE]") for x in long_streams), long_streams
    # while it was down: 503 + Retry-After from the front door, named maintenance, at once; everything else 200
    refused = [x for x in results if x["status"] != 200]
    assert refused, "no request met the maintenance switch"
    for x in refused:
        # when it was sent, seconds into the playbook's run (which phase: the prefill's maintenance, or a decode out)
        seen = {"sent_s_into_run": round(x["t0"] - t0, 2), "run_s": round(took, 1), **x}
        assert (x["status"], x["retry_after"], x["refusal"]) == (503, "2", "maintenance"), seen
        # at once: not queued (the queue times out at 10 s here) nor held until the prefill is back (a restart takes
        # longer); 1.37 s seen under the whole suite's load on 2 cores, ~0.01 s alone
        assert x["seconds"] < 3.0, x
    assert max(x["seconds"] for x in results) < 30, "a request hung"
    assert all(x["stream"] is False or x["status"] != 200 or "[DONE]" in x["tail"] for x in results)
    window = max(x["t0"] for x in refused) - min(x["t0"] for x in refused)
    print(f"only prefill restarted in a {took:.0f} s run: {len(refused)} of {len(results)} requests refused with 503 "
          f"maintenance in <= {max(x['seconds'] for x in refused) * 1000:.0f} ms over {window:.1f} s (maintenance "
          f"on to off), 2 long streams in flight finished ({max(x['seconds'] for x in long_streams):.1f} s)")
    code, body = completion(two_decode)
    assert code == 200, body


def test_a_repaired_model_restarts_the_servers_through_the_rolling_restart(two_decode):
    """A shard corrupted on the host (size and mtime kept): the full verify repairs it, and since the running servers
    loaded the old bytes, the serving phase gives each of them the rolling restart (new containers); a quick run
    before it sees nothing and restarts nothing."""
    host = "pdstack-roll-1"
    shard = "/models/pdstack-sim/model-00002-of-00003.safetensors"
    ids = {n: container_id(host, f"pdstack-{n}") for n in ("prefill-0", "decode-0", "decode-1")}
    code = (f"import os; p={shard!r}; st=os.stat(p); os.chmod(p, 0o644); f=open(p, 'r+b'); f.seek(777); "
            "b=f.read(1); f.seek(777); f.write(bytes([b[0] ^ 1])); f.close(); os.chmod(p, 0o444); "
            "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))")
    assert sh(host, "python3", "-c", code).returncode == 0
    # the servers' environment as the test above left it (a run that sets it first: a no-op after that test), so
    # that only the model can restart them
    same = _servers_with_env({n: {"ROLLOUT_TEST": "1"} for n in ("prefill-0", "decode-0", "decode-1")})
    settle = playbook(TWO, "--tags", "serving", "-e", same)
    assert settle.returncode == 0, settle.stdout[-4000:]
    ids = {n: container_id(host, f"pdstack-{n}") for n in ids}
    quick = playbook(TWO, "--tags", "model,serving", "-e", same)
    assert quick.returncode == 0, quick.stdout[-4000:]
    assert all(x["changed"] == 0 for x in recap(quick.stdout).values()), changed_tasks(quick.stdout)
    assert {n: container_id(host, f"pdstack-{n}") for n in ids} == ids
    full = playbook(TWO, "--tags", "model,serving", "-e", same, "-e", "pdstack_model_verify=full")
    assert full.returncode == 0, full.stdout[-6000:]
    assert "repaired model-00002-of-00003.safetensors" in full.stdout, full.stdout[-4000:]
    after = {n: container_id(host, f"pdstack-{n}") for n in ids}
    assert all(after[n] != ids[n] for n in ids), (ids, after)
    # each through the rolling restart (roles/serving/tasks/restart.yml: drained, restarted, probed, put back)
    for n in ids:
        assert f"Serving | restart pdstack-server-{n}.service" in full.stdout, n


def _router_workers(host: str) -> dict[str, bool]:
    r = sh(host, "python3", "-c", "import urllib.request; print(urllib.request.urlopen("
           "'http://127.0.0.1:8001/workers').read().decode())")
    assert r.returncode == 0, r.stderr
    return {w["url"]: bool(w.get("is_healthy")) for w in json.loads(r.stdout)["workers"]}


def test_a_stopped_server_out_of_the_router_is_started_and_put_back_by_the_serving_phase(two_decode):
    """What a failed rolling restart leaves (`invoke tune`'s candidate that never starts): the server out of the
    router and not running. `site.yml --tags serving` (tune's next run; the router play's own put-back is not in
    it) starts it, waits for /health and puts it back into the router before the next server, restarting nothing
    else; the front door then answers through it."""
    host, decode0 = "pdstack-roll-1", "http://pdstack-roll-1:30001"
    out = sh(host, "python3", "-I", "/usr/local/lib/pdstack/pdstack-hostside.pyz", "drain", "out",
             "--router", "http://127.0.0.1:8001", "--worker-url", decode0)
    assert out.returncode == 0 and json.loads(out.stdout)["changed"] is True, (out.stdout, out.stderr)
    assert sh(host, "systemctl", "stop", "pdstack-server-decode-0.service").returncode == 0
    assert decode0 not in _router_workers(host)
    others = {n: container_id(host, f"pdstack-{n}") for n in ("prefill-0", "decode-1")}
    same = _servers_with_env({n: {"ROLLOUT_TEST": "1"} for n in ("prefill-0", "decode-0", "decode-1")})
    r = playbook(TWO, "--tags", "serving", "-e", same)
    assert r.returncode == 0, r.stdout[-6000:]
    assert "Serving | back into the router that serves, wait until it lists it healthy decode-0" in r.stdout
    listed = _router_workers(host)
    assert listed == {"http://pdstack-roll-1:30000": True, decode0: True, "http://pdstack-roll-1:30002": True}, listed
    assert {n: container_id(host, f"pdstack-{n}") for n in others} == others  # nothing else restarted
    assert "Serving | restart pdstack-server-" not in r.stdout, changed_tasks(r.stdout)

    # the router sends work to it again: decode-0's own count of received requests grows
    def received() -> int:
        st = sh(host, "python3", "-c", "import urllib.request; print(urllib.request.urlopen("
                "'http://127.0.0.1:30001/_sim/state').read().decode())")
        return json.loads(st.stdout)["received"]

    before = received()
    for _ in range(6):  # round_robin (the inventory's policy) over both decodes
        status, text = completion(two_decode, max_tokens=4)
        assert status == 200, text[:500]
    assert received() > before, "the router sent nothing to the decode it put back"
