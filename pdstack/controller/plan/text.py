"""The plan for people: what `pdstack plan` prints (without --json); the JSON plan is the contract, this its view."""

from __future__ import annotations

from pdstack.controller.plan.planner import Plan


def recall_text(rc: dict) -> list[str]:
    """The smoke phase's recall gate: its grid, the gate, and what it costs on the real host."""
    out = [f"recall gate: horizon >= {rc['min_horizon']} tokens; estimates at {rc['prefill_tps']:g} prefill tok/s "
           "(pdstack_smoke.prefill_tps, every prompt uncached)"]
    for name, g in (("smoke", rc["grid"]), ("--full", rc["full"])):
        fits = f", budget {rc['budget_s']:g} s" if name == "smoke" else ""
        depths = ",".join(f"{d:g}" for d in g["depths"])
        out.append(f"  {name:6} lengths {','.join(map(str, g['lengths']))}; depths {depths} %; "
                   f"{'+'.join(g['kinds'])} ({g['needles']} keys), jitter 0..{g['jitter']}: {g['cells']} cells, "
                   f"{g['requests']} requests, {g['prompt_tokens']:,} tokens, ~{g['estimate_s']} s{fits}")
    return out


def p2p_line(host: str, g: dict) -> str:
    """The P2P gate of one host, for people: what it will measure against which floors, or why nothing."""
    if not g["run"]:
        return f"host {host}: P2P gate: skipped ({g['reason']})"
    floors = sorted({(p["placement"], p["floor_gbs"]) for p in g["pairs"]}, key=lambda x: -x[1])
    return (f"host {host}: P2P gate before the servers start: {len(g['pairs'])} GPU pair(s) over GPUs "
            f"{','.join(map(str, g['devices']))}, {len(g['groups'])} all-reduce group(s); floors "
            f"{', '.join(f'{f:g} GB/s {where}' for where, f in floors)}")


def render_text(plan: Plan) -> str:
    """The plan for people."""
    out = [f"pdstack plan: {plan.inventory} ({plan.environment}, engine {plan.engine}"
           + (", TEST ENGINE" if plan.engine == "sim" else "") + ")",
           f"  image  {plan.image}" + (f" (pulled by digest: {plan.image_pull})" if plan.image_pull else ""),
           f"  model  {plan.model['served_name']} from {plan.model['path']} (context {plan.model['context_length']})",
           f"         index keys {plan.model['index_k_dtype']}: {plan.model['index_reader']}"]
    lock, src = plan.model.get("lock"), plan.model.get("source")
    if lock and src:
        frm = {"hf": f"{src.get('repo')}@{src.get('revision')} ({src.get('endpoint')})", "http": src.get("url"),
               "rsync": src.get("rsync"), "path": "already on the host (verify only)"}[src["type"]]
        out.append(f"         {src['type']} source {frm}; lock {lock['file']}: {len(lock['files'])} files, "
                   f"{lock['bytes'] / 1e9:.2f} GB, digest {lock['digest'][:12]}")
    out.append("")
    for s in plan.servers:
        out += [f"{s.role} {s.name} on {s.host} ({s.url})",
                f"  GPUs {','.join(map(str, s.gpus))}  TP {s.tp_size}  NUMA node {s.numa_node} ({s.numa_source})  "
                f"cpuset-cpus {s.cpuset_cpus}  cpuset-mems {s.cpuset_mems}"]
        if s.hicache.enabled:
            out += ["  HiCache:"] + [f"   {line}" for line in s.hicache.arithmetic]
        else:
            out += ["  HiCache: off"]
        ro = s.rollout
        how = (f"taken out of the router while it drains (peers: {', '.join(ro['peers'])})" if ro["drain"] == "router"
               else f"the front door answers 503 + Retry-After while it drains (the only {s.role})")
        out += [f"  restart: {how}",
                f"  env  {' '.join(f'{k}={v}' for k, v in s.env.items()) or '-'}",
                f"  argv {' '.join(s.argv)}", ""]
    r = plan.router
    fd = r.frontdoor
    adm = (f"at most {fd['max_concurrent_requests']} in flight, {fd['queue_size']} waiting up to "
           f"{fd['queue_timeout_secs']} s (then 503), beyond: 429" if fd["max_concurrent_requests"] > 0
           else "admission off")
    out += [f"front door (HAProxy) on {r.host} ({r.url}, metrics {fd['metrics_url']}): {adm}; Retry-After "
            f"{fd['retry_after_secs']} s",
            f"router on {r.host} ({r.internal_url} behind the front door, metrics {r.metrics_url}; stop: drain "
            f"{r.stop_timeout_secs - 10} s)", f"  argv {' '.join(r.argv)}", ""]
    out += [f"rollouts: one server at a time, drain <= {plan.rollout['drain_timeout_secs']} s, probe <= "
            f"{plan.rollout['probe_timeout_secs']} s", ""]
    if plan.recall:
        out += recall_text(plan.recall) + [""]
    for h, w in sorted(plan.host_settings.items()):
        if w["gpu_model"] == "none":
            out.append(f"host {h}: PCIe settings: none (no NVIDIA GPU)")
            continue
        out.append(f"host {h}: PCIe settings for {w['gpu_model']} (reboot policy {w['reboot_policy']}): kernel "
                   f"{' '.join(w['kernel_args']) or '-'}; ACS off on {', '.join(w['acs_bridges']) or 'no bridge'}; "
                   f"driver branch {w['driver_branch']}")
        # in force and waiting for a reboot always (none, said), the other two where they hold anything
        for state, label in (("in_force", "in force"), ("applied_now", "applied now"),
                             ("pending_reboot", "waiting for a reboot"), ("unknown", "not read")):
            if w[state] or state in ("in_force", "pending_reboot"):
                out.append(f"  {label}: {'; '.join(w[state]) or 'none'}")
    for h, g in sorted(plan.p2p.items()):
        if g["devices"]:
            out.append(p2p_line(h, g))
    out += [f"monitoring on {', '.join(plan.monitoring_hosts)}"]
    out += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(out)
