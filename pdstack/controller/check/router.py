"""The router's settings, rollouts and the smoke gate's settings."""

from __future__ import annotations

from pdstack.controller.check.extra_args import dests, extra_arg_problems
from pdstack.controller.load import flags, recall_grid, rules
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.tables import OWNED_ROUTER_FLAGS, WORKER_SET_ROUTER_FLAGS


def router_problems(dep: Deployment, p: list[str]) -> None:
    r = dep.router
    parser = flags.router_parser()
    owned = dests(parser, OWNED_ROUTER_FLAGS)
    refused = {d: f"--{flag} adds workers from outside the inventory or changes the router's mode (the workers are "
                  "exactly the pdstack_servers, in PD mode)" for d, (flag, _) in
               dests(parser, WORKER_SET_ROUTER_FLAGS).items()}
    before = len(p)
    for key, value in r["extra_args"].items():
        p.extend(extra_arg_problems(parser, "pdstack_router", key, value, owned, refused, "sglang-router 0.3.2"))
    if len(p) == before and r["extra_args"]:
        err = flags.check_router(["--pd-disaggregation", "--prefill", "http://x:1", "--decode", "http://y:1",
                                  *flags.render_extra(r["extra_args"], parser)])
        if err:
            p.append(f"pdstack_router.extra_args: sglang-router 0.3.2 rejects it: {err}; spell each flag as "
                     "`python -m sglang_router.launch_router --help` does and give it a value it takes")
    hc = r["health_check"]
    if not hc["endpoint"].startswith("/") or rules.unit_value_problem(hc["endpoint"]):
        p.append(f"pdstack_router.health_check.endpoint: {hc['endpoint']!r} must be a URL path on the workers "
                 "starting with '/', e.g. /health (no spaces or quotes)")
    if hc["timeout_secs"] > hc["interval_secs"]:
        dep.warnings.append(f"pdstack_router.health_check: timeout_secs {hc['timeout_secs']} is longer than "
                            f"interval_secs {hc['interval_secs']}; polls overlap")
    adm = r["admission"]
    if adm["max_concurrent_requests"] == 0 or adm["max_concurrent_requests"] < -1:
        p.append("pdstack_router.admission.max_concurrent_requests: must be -1 (off) or > 0, got "
                 f"{adm['max_concurrent_requests']}")
    if adm["queue_size"] < 0:
        p.append(f"pdstack_router.admission.queue_size: must be >= 0 (0: no queue, refuse at once), got "
                 f"{adm['queue_size']}")
    ret = r["retries"]
    for k in ("max_retries", "initial_backoff_ms", "max_backoff_ms"):
        if ret[k] < 0:
            p.append(f"pdstack_router.retries.{k}: must be >= 0, got {ret[k]}")
    if 0 <= ret["max_backoff_ms"] < ret["initial_backoff_ms"]:
        p.append(f"pdstack_router.retries.max_backoff_ms: {ret['max_backoff_ms']} is below initial_backoff_ms "
                 f"{ret['initial_backoff_ms']}; the cap must be >= the first backoff")


def rollout_problems(dep: Deployment, p: list[str]) -> None:
    drain, limit = dep.rollout.get("drain_timeout_secs"), dep.router["request_timeout_secs"]
    if isinstance(drain, int) and not isinstance(drain, bool) and isinstance(limit, int) and drain > limit:
        p.append(f"pdstack_rollout.drain_timeout_secs: {drain} s is longer than pdstack_router.request_timeout_secs "
                 f"{limit} s; no request lives longer than that (the router cuts it), so the rest of the wait could "
                 f"only be spent on a wedged request: set drain_timeout_secs <= {limit}, or leave it unset (= {limit})")


def smoke_problems(dep: Deployment, p: list[str]) -> None:
    sm, ctx = dep.smoke, dep.model["context_length"]
    if not sm or not sm.get("enabled"):
        return
    lengths = sm["grid"]["lengths"] + ((sm.get("full") or {}).get("lengths") or [])
    too_long = sorted({n for n in lengths if n > ctx})
    if too_long:
        p.append(f"pdstack_smoke.grid.lengths: {too_long} are past pdstack_model.context_length {ctx}; the longest "
                 f"recall length is the context (its prompt is built {recall_grid.ANSWER_ROOM} tokens shorter, room "
                 "for the answer): drop them or raise context_length")
    est = recall_grid.smoke_estimates(sm, ctx, recall_grid.concurrency(sm, dep.router["admission"]))
    est = est["grid"]["estimate_s"]
    if est > sm["recall_budget_s"]:
        p.append(f"pdstack_smoke.grid: its recall run is estimated at {est} s on the real host "
                 f"({sm['prefill_tps']:g} prefill tok/s), over pdstack_smoke.recall_budget_s {sm['recall_budget_s']:g} "
                 "s: move lengths or depths to pdstack_smoke.full (the --full run), or raise the budget")
    longest = max(sm["grid"]["lengths"])  # the gate is the default grid's (--full reports past it)
    if sm["min_horizon"] > longest:
        p.append(f"pdstack_smoke.min_horizon: {sm['min_horizon']} is beyond the longest recall length "
                 f"{longest}, so the gate can never pass; lower it or add a longer length to grid.lengths")
    if dep.environment == "production" and (longest < ctx or sm["min_horizon"] < ctx // 2):
        p.append(f"pdstack_smoke: production's recall gate must reach the context it serves: grid.lengths up to "
                 f"pdstack_model.context_length {ctx} (longest: {longest}) and min_horizon at least {ctx // 2} "
                 f"(now {sm['min_horizon']}); set them (inventory/production's smoke.yml), or lower context_length")
    if not sm.get("tokenizer") and dep.model_lock is None:  # with a lock, the model phase copies its tokenizer
        p.append("pdstack_smoke.tokenizer: unset, and the smoke gate builds its prompts with the model's tokenizer; "
                 "set it to the model's tokenizer directory on the controller, give the model a source and a lock "
                 "(pdstack_model.source: the model phase copies the lock's tokenizer to the controller), or set "
                 "pdstack_smoke.enabled: false")
