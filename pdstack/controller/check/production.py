"""The production profile: what pdstack_environment: production demands on top of every other check.

Each rule here is one that a test or local deployment may break on purpose (the sim engine, admission off, a
placeholder address, KV transfer without RDMA) but that production must not break silently: the refusal names the
variable and the fix. `production_problems` needs only the inventory; `production_facts_problems` compares the
servers' RDMA settings with each host's recorded facts.
"""

from __future__ import annotations

from pdstack.controller.load import rules
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.tables import server_where

# SGLang 0.5.23's transfer backends (sglang/srt/disaggregation/utils.py TransferBackend, and
# sglang/srt/arg_groups/choices.py DISAGG_TRANSFER_BACKEND_CHOICES, which adds mooncake_tcp:
# arg_groups/pd_disaggregation_hook.py rewrites it to mooncake with MC_FORCE_TCP=1). Those that move no KV, or
# move it only on other hardware than the NVIDIA GPUs pdstack_model.gpu_arch allows (sm_90/sm_100/sm_120):
NOT_PRODUCTION_BACKENDS = {
    "fake": "SGLang's warm-up backend (disaggregation/fake/conn.py: 'For warmup reqs, we don't kv transfer'); it "
            "moves no KV, so decode would run on pages prefill never filled",
    "ascend": "the Huawei Ascend NPU backend (disaggregation/ascend/, torch_npu); these hosts run NVIDIA GPUs",
    "mori": "AMD's MORI-IO backend (disaggregation/mori/conn.py imports mori.io, a ROCm library); these hosts run "
            "NVIDIA GPUs",
}
# Backends that move KV over RDMA, so --disaggregation-ib-device is read (mooncake_tcp forces TCP and drops it).
RDMA_BACKENDS = ("mooncake", "nixl")
ROUTER_FILE = "group_vars/all/router.yml"


def production_problems(dep: Deployment, deploy: bool = True) -> list[str]:
    """Every production rule that needs only the inventory; [] outside production."""
    if dep.environment != "production":
        return []
    p: list[str] = []
    if dep.image["engine"] == "sim":
        p.append("pdstack_image.engine: 'sim' is the TEST ENGINE and never runs in production; set engine: sglang")
    _admission_problems(dep, p)
    servers = [(h.name, i, s) for h in dep.hosts.values() for i, s in enumerate(h.servers)]
    for host, i, s in servers:
        backend = s["transfer"]["backend"]
        if backend in NOT_PRODUCTION_BACKENDS:
            p.append(f"{server_where(host, i, s)}.transfer.backend: {backend!r} is "
                     f"{NOT_PRODUCTION_BACKENDS[backend]}; in production set transfer.backend: mooncake (RDMA), nixl, "
                     "or mooncake_tcp (no RDMA) on every prefill and decode server")
    _rdma_pair_problems(servers, p)
    address_problems(dep, p, deploy)
    return p


def _admission_problems(dep: Deployment, p: list[str]) -> None:
    adm = dep.router["admission"]
    if adm["max_concurrent_requests"] == -1:
        p.append("pdstack_router.admission.max_concurrent_requests: -1 (admission control off) in production: the "
                 "front door would pass every request on, and a burst queues minutes of TTFT in the prefill servers "
                 "(also what a commented-out, null or overridden admission: section gives, since the defaults are "
                 f"off); set pdstack_router.admission.max_concurrent_requests (e.g. 32) and queue_size (e.g. 64) in "
                 f"{ROUTER_FILE}, once")


def _rdma_pair_problems(servers, p: list[str]) -> None:
    """Every prefill sends KV to every decode: when one side names its RDMA devices, the other must too (else that
    side's backend picks devices on its own, or none, and the pair's transfer falls back or fails at the first
    request)."""
    rdma = [(host, i, s) for host, i, s in servers if s["transfer"]["backend"] in RDMA_BACKENDS]
    named = [t for t in rdma if t[2]["transfer"]["ib_device"]]
    if not named:
        return
    for host, i, s in rdma:
        if s["transfer"]["ib_device"]:
            continue
        peers = [t for t in named if t[2]["role"] != s["role"]]
        if peers:
            who = ", ".join(f"{ps['name']} ({ps['role']}, {ph}: {ps['transfer']['ib_device']})"
                            for ph, _pi, ps in peers)
            p.append(f"{server_where(host, i, s)}.transfer.ib_device: unset, but its PD peers name their RDMA devices "
                     f"({who}); set transfer.ib_device on this {s['role']} server too (`ibv_devices` on {host} lists "
                     "them), or unset it on every server")


def production_facts_problems(dep: Deployment, facts: dict[str, dict]) -> list[str]:
    """RDMA consistency against the facts: a PD pair on two hosts whose RDMA backend finds devices on one side and
    none on the other cannot move KV over RDMA."""
    if dep.environment != "production":
        return []
    p: list[str] = []
    pd = [(h.name, i, s) for h in dep.hosts.values() for i, s in enumerate(h.servers)
          if s["transfer"]["backend"] in RDMA_BACKENDS]

    def devices(host: str) -> list[str] | None:
        f = facts.get(host)
        ib = f.get("infiniband") if isinstance(f, dict) else None
        return ib if isinstance(ib, list) else None

    seen: set[tuple[str, str]] = set()
    for host, i, s in pd:
        for peer_host, _j, peer in pd:
            if peer["role"] == s["role"] or peer_host == host or (host, peer_host) in seen:
                continue
            mine, theirs = devices(host), devices(peer_host)
            if mine and theirs is None and (host, peer_host) not in seen:
                seen.add((host, peer_host))
                p.append(f"{server_where(host, i, s)}.transfer.backend: {s['transfer']['backend']} moves KV over RDMA, "
                         f"and host {host} has RDMA devices ({', '.join(mine)}), but the facts of its PD peer "
                         f"{peer['name']}'s host {peer_host} have no InfiniBand list at all, so the pair cannot be "
                         f"checked; record {peer_host}'s facts again with `pdstack facts` (the facts phase)")
            elif mine and theirs == []:
                seen.add((host, peer_host))
                p.append(f"{server_where(host, i, s)}.transfer.backend: {s['transfer']['backend']} moves KV over RDMA, "
                         f"and host {host} has RDMA devices ({', '.join(mine)}), but its PD peer {peer['name']}'s "
                         f"host {peer_host} lists none (/sys/class/infiniband is empty in its facts); fix the RDMA "
                         f"driver on {peer_host} and record its facts again, or set transfer.backend: mooncake_tcp "
                         "on every prefill and decode server")
    return p


def address_problems(dep: Deployment, p: list[str], deploy: bool) -> None:
    """Addresses production needs real: no loopback (the controller's smoke gate and the operators reach the router
    host at it) and no documentation range (the production example's placeholder)."""
    multi = len(dep.hosts) > 1
    for name, h in dep.hosts.items():
        var = f"host_vars/{name} pdstack_address" if h.address_source == "pdstack_address" else \
            f"ansible_host of host {name} (hosts.yml; or set pdstack_address)"
        a, err = rules.parse_address(h.address)
        if err:
            continue  # network.py names it
        if not multi and rules.is_loopback(a):  # several hosts: network.py refuses loopback in every environment
            p.append(f"{var}: {h.address} is a loopback address; in production the controller runs the smoke gate "
                     "against the router at it (and operators reach Grafana and the router there): give the "
                     "address the controller and the other hosts reach the host at")
        if net := rules.doc_net(a):
            msg = (f"{var}: {h.address} is in the documentation range {net} (addresses for examples, like the "
                   "production example's placeholder, never a real host); put the host's real address there")
            if deploy:
                p.append(msg)
            else:
                dep.warnings.append(msg + " before deploying (preflight refuses it)")
        if h.ansible_host and h.ansible_host != h.address:
            conn, _ = rules.parse_address(h.ansible_host)
            if conn is not None and (net := rules.doc_net(conn)):
                msg = (f"ansible_host of host {name} (hosts.yml): {h.ansible_host} is in the documentation range "
                       f"{net}, so Ansible cannot reach the host; put its real address there")
                (p.append if deploy else dep.warnings.append)(msg)
