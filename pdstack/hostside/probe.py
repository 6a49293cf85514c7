"""`pdstack probe`: deep liveness of a PD deployment through its router.

/health on an SGLang PD server never exercises the KV transfer (it uses a fake bootstrap host), and a wedged decode
keeps answering 200 (docs/facts.md#the-deployment, Liveness). The probe sends one short *streamed* generation
through the router, with deadlines, so a pass proves tokens flowed through prefill, the KV transfer and decode:

    the prompt is a needle ("The secret code for pdstack-probe is <random>. What is ...?") -> the answer must carry
    the random code, so the decode side really got this prompt's KV, not a stale or garbled one.

When it fails it names the stage (exit codes are stable; the watchdog and systemd units act on them):

    0  ok                tokens flowed; the answer carries the code
    10 router-down       the router did not accept the connection (unit down, wrong URL), or the front door says
                         so (503, X-Pdstack-Refusal: router-down: sglang-router behind it does not answer)
    11 admission         refused: 429 (queue full), 408, or the front door's 503 for a queue timeout or a planned
                         restart (X-Pdstack-Refusal: queue-timeout / maintenance): busy, not broken, no restart
    12 http-error        any other HTTP error from the router or a worker (5xx, 4xx), or a malformed stream
    13 prefill/transfer  no first token before --first-token-timeout (the prompt never reached decode)
    14 decode            the first token came, then the stream stalled past --stall-timeout; or no first token while
                         the decode server holds the request as running (needs --decode; a wedged decode)
    15 aborted           the stream ended with a worker's abort (KV transfer / bootstrap failure message included)
    16 wrong-answer      tokens flowed but the answer does not carry the code (KV corruption, or a model problem)
    17 auth              the front door refused the API key (401/403): an access problem, not a broken server, no
                         restart (the smoke gate sends the key, controller/gates/apikey.py; the watchdog probes the
                         router behind the front door and needs none)

Stdlib only: the watchdog runs it with the router host's python3 (see pdstack/hostside/watchdog.py).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import queue
import random
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field

OK, ROUTER_DOWN, ADMISSION, HTTP_ERROR, PREFILL_TRANSFER, DECODE, ABORTED, WRONG_ANSWER, AUTH = (
    0, 10, 11, 12, 13, 14, 15, 16, 17)
STAGES = {OK: "ok", ROUTER_DOWN: "router-down", ADMISSION: "admission", HTTP_ERROR: "http-error",
          PREFILL_TRANSFER: "prefill/transfer", DECODE: "decode", ABORTED: "aborted", WRONG_ANSWER: "wrong-answer",
          AUTH: "auth"}
PROBE_KEY = "pdstack probe"
# The front door's refusals name their reason (controller/render/frontdoor_answers.py names them; the names agree).
REFUSAL_HEADER = "X-Pdstack-Refusal"
QUEUE_FULL, QUEUE_TIMEOUT, ROUTER_DOWN_REASON, MAINTENANCE = "queue-full", "queue-timeout", "router-down", "maintenance"
BUSY_REASONS = (QUEUE_FULL, QUEUE_TIMEOUT, MAINTENANCE)  # retry later; not broken


def refusal_reason(status: int, header: str | None, body: str = "") -> str | None:
    """Why the front door (or an admission layer) refused a request: queue-full, queue-timeout, router-down,
    maintenance; None when the answer is not a refusal (any other error is the deployment's). `header`: the
    answer's X-Pdstack-Refusal. 429/408 without it (another limiter) read as queue-full/queue-timeout."""
    if header in (*BUSY_REASONS, ROUTER_DOWN_REASON):
        return header
    if status == 429:
        return QUEUE_FULL
    if status == 408:
        return QUEUE_TIMEOUT
    if status == 503 and '"type": "router_down"' in (body or ""):
        return ROUTER_DOWN_REASON
    if status == 503 and '"type": "overloaded"' in (body or ""):
        return QUEUE_TIMEOUT
    return None


@dataclass
class ProbeResult:
    code: int
    stage: str
    message: str
    ttft_s: float | None = None
    tokens: int = 0
    elapsed_s: float = 0.0
    http_status: int | None = None
    text: str = ""
    workers: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.code == OK

    def to_dict(self) -> dict:
        return asdict(self)


def _result(code: int, message: str, **kw) -> ProbeResult:
    return ProbeResult(code=code, stage=STAGES[code], message=message, **kw)


_METRIC_RE = re.compile(r"^(sglang:[a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def scrape_gauges(base_url: str, timeout: float = 2.0) -> dict[str, float] | None:
    """sglang:* samples of a server's /metrics summed over labels; None when it does not answer."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:  # noqa: S310
            text = r.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, http.client.HTTPException):
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC_RE.match(line.strip())
        if m:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
            except ValueError:
                pass
    return out


def _worker_snapshot(prefill: list[str], decode: list[str]) -> dict:
    snap = {}
    keys = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
            "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
            "sglang:num_decode_transfer_queue_reqs")
    for role, urls in (("prefill", prefill), ("decode", decode)):
        for u in urls:
            g = scrape_gauges(u)
            snap[u] = {"role": role, "reachable": g is not None,
                       **({k.split(":", 1)[1]: g.get(k, 0.0) for k in keys} if g else {})}
    return snap


def _no_first_token(snap: dict, waited: float) -> ProbeResult:
    """Attribute a missing first token to a stage from the workers' queue gauges (taken while the request waits)."""
    dec = [v for v in snap.values() if v["role"] == "decode" and v["reachable"]]
    if any(v["num_running_reqs"] > 0 and v["num_decode_transfer_queue_reqs"] == 0
           and v["num_decode_prealloc_queue_reqs"] == 0 for v in dec):
        return _result(DECODE, f"no first token after {waited:.1f}s while decode holds the request as running: "
                               "decode is wedged (its /health may still say 200)", workers=snap)
    where = "prefill or the KV transfer"
    if any(v["num_decode_transfer_queue_reqs"] > 0 for v in dec):
        where = "the KV transfer (decode waits in its transfer queue)"
    elif any(v["num_decode_prealloc_queue_reqs"] > 0 for v in dec):
        where = "the prefill/decode bootstrap handshake (decode waits in its prealloc queue)"
    hint = "" if snap else "; pass --prefill/--decode URLs to tell prefill, transfer and a decode wedge apart"
    return _result(PREFILL_TRANSFER, f"no first token after {waited:.1f}s: stuck in {where}{hint}", workers=snap)


def _pair_prefill(prefill_url: str, body: dict, timeout: float) -> None:
    """The prefill half of a direct PD request (as the router sends it): its answer is not used, only its work."""
    req = urllib.request.Request(prefill_url.rstrip("/") + "/generate", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with contextlib.suppress(OSError, urllib.error.URLError, http.client.HTTPException, ValueError):
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the deployment's own server)
            r.read()


def probe(url: str, *, first_token_timeout: float = 60.0, stall_timeout: float = 15.0, total_timeout: float = 120.0,
          max_new_tokens: int = 16, prefill: list[str] | None = None, decode: list[str] | None = None,
          code: str | None = None, check_answer: bool = True, headers: dict[str, str] | None = None,
          pair: tuple[str, str, int] | None = None) -> ProbeResult:
    """One streamed /generate through the router. Never raises for network or HTTP problems. `headers`: sent
    with the request (the front door's `Authorization`, pdstack/controller/gates/apikey.py).

    `pair` (prefill URL, bootstrap host, bootstrap port): send it straight to one PD pair instead, as sglang-router
    does (the same body to the prefill and to the decode at `url`, with bootstrap_host/port/room): a server taken
    out of the router for a restart is probed that way before it is put back.

    A reader thread does the blocking HTTP work and posts events; this thread enforces the deadlines and, when one
    passes, snapshots the workers' queues (while the request is still in flight) and cuts the connection."""
    prefill, decode = list(prefill or []), list(decode or [])
    secret = code or str(random.SystemRandom().randrange(1000, 10000))
    prompt = f"The secret code for {PROBE_KEY} is {secret}. What is the secret code for {PROBE_KEY}?"
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
    if pair is not None:
        body.update(bootstrap_host=pair[1], bootstrap_port=int(pair[2]),
                    bootstrap_room=random.SystemRandom().randrange(1, 2 ** 63))
        threading.Thread(target=_pair_prefill, args=(pair[0], body, total_timeout), name="pdstack-probe-prefill",
                         daemon=True).start()
        prefill = prefill or [pair[0]]
        decode = decode or [url]
    parsed = urllib.parse.urlsplit(url.rstrip("/"))
    conn_cls = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parsed.hostname or "127.0.0.1", parsed.port or (443 if parsed.scheme == "https" else 80),
                    timeout=total_timeout + 5)
    events: queue.Queue = queue.Queue()

    def reader() -> None:
        try:
            try:
                conn.request("POST", (parsed.path or "") + "/generate", body=json.dumps(body),
                             headers={"Content-Type": "application/json", "Accept": "text/event-stream",
                                      **(headers or {})})
            except (OSError, http.client.HTTPException) as e:
                events.put(("down", e))
                return
            resp = conn.getresponse()
            if resp.status != 200:
                events.put(("status", resp.status, resp.read(500).decode("utf-8", "replace").strip(),
                            resp.getheader("Retry-After"), resp.getheader(REFUSAL_HEADER)))
                return
            events.put(("status", 200, "", None))
            for line in resp:
                events.put(("line", line))
            events.put(("eof", None))
        except Exception as e:  # also the races of a connection closed under it after a deadline
            events.put(("error", e))

    start = time.monotonic()
    t = threading.Thread(target=reader, name="pdstack-probe-reader", daemon=True)
    t.start()
    st = _Stream(secret, check_answer, start, prefill, decode, key_sent="Authorization" in (headers or {}))
    try:
        while True:
            now = time.monotonic()
            if st.ttft is None:
                wait = first_token_timeout - (now - start)
            else:
                wait = min(stall_timeout - (now - st.last_tok), total_timeout - (now - start))
            if wait <= 0:
                return st.deadline(now, stall_timeout, total_timeout)
            try:
                ev = events.get(timeout=wait)
            except queue.Empty:
                continue
            res = st.feed(ev, url)
            if res is not None:
                res.elapsed_s = time.monotonic() - start
                return res
    finally:
        with contextlib.suppress(OSError):
            if conn.sock is not None:
                conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        t.join(2.0)


class _Stream:
    """State of one streamed answer; feed() returns a final result or None to go on."""

    def __init__(self, secret: str, check_answer: bool, start: float, prefill: list[str], decode: list[str],
                 key_sent: bool = False):
        self.secret, self.check_answer, self.start, self.key_sent = secret, check_answer, start, key_sent
        self.prefill, self.decode = prefill, decode
        self.tokens, self.ttft, self.last_tok, self.text = 0, None, start, ""

    def deadline(self, now: float, stall_timeout: float, total_timeout: float) -> ProbeResult:
        snap = _worker_snapshot(self.prefill, self.decode)
        if self.ttft is None:
            res = _no_first_token(snap, now - self.start)
        elif now - self.last_tok >= stall_timeout:
            res = _result(DECODE, f"decode stalled: {self.tokens} token(s), then nothing for "
                                  f"{now - self.last_tok:.1f}s (--stall-timeout {stall_timeout:g})", workers=snap)
        else:
            res = _result(DECODE, f"generation did not finish within {total_timeout:g}s ({self.tokens} tokens)",
                          workers=snap)
        res.ttft_s, res.tokens, res.text, res.elapsed_s = self.ttft, self.tokens, self.text, now - self.start
        return res

    def _partial(self, code: int, message: str, **kw) -> ProbeResult:
        return _result(code, message, ttft_s=self.ttft, tokens=self.tokens, text=self.text, **kw)

    def feed(self, ev: tuple, url: str) -> ProbeResult | None:
        kind = ev[0]
        if kind == "down":
            return _result(ROUTER_DOWN, f"router {url} not reachable: {ev[1]}")
        if kind == "error":
            return self._partial(HTTP_ERROR, f"connection broke after {self.tokens} token(s): {ev[1]!r}")
        if kind == "status":
            status, detail = ev[1], ev[2]
            retry_after = ev[3] if len(ev) > 3 else None
            reason = refusal_reason(status, ev[4] if len(ev) > 4 else None, detail)
            if reason == ROUTER_DOWN_REASON:
                return _result(ROUTER_DOWN, f"router down: the front door at {url} answers {status} "
                                            f"({REFUSAL_HEADER}: router-down): sglang-router behind it does not "
                                            "answer", http_status=status)
            if reason is not None:
                why = {QUEUE_FULL: f"queue full ({status})", QUEUE_TIMEOUT: f"queue timeout ({status})",
                       MAINTENANCE: f"maintenance ({status}): a server is restarting (planned)"}[reason]
                ra = f", Retry-After {retry_after}" if retry_after is not None else ""
                return _result(ADMISSION, f"admission refused the probe: {why}{ra}; busy, not broken",
                               http_status=status)
            if status in (401, 403):
                why = ("the key sent is not one it accepts" if self.key_sent
                       else "no key was sent and the deployment requires one")
                return _result(AUTH, f"the front door refused the API key (HTTP {status}): {why}. An access "
                                     "problem, not a model failure", http_status=status)
            if status != 200:
                return _result(HTTP_ERROR, f"HTTP {status} from {url}/generate: {detail or '(empty body)'}",
                               http_status=status)
            return None
        # the router cuts a stream off at its request timeout (a wedged decode: docs/facts.md#sglang-router-032)
        if kind == "eof":
            now = time.monotonic()
            snap = _worker_snapshot(self.prefill, self.decode)
            if self.tokens == 0:
                res = _no_first_token(snap, now - self.start)
                res.message += " (the router cut the stream off: its request timeout)"
                return res
            return self._partial(DECODE, f"stream cut off without [DONE] after {self.tokens} token(s): decode "
                                         "stalled until the router's request timeout", workers=snap)
        line = ev[1].decode("utf-8", "replace").strip()
        if not line or line.startswith(":"):
            return None
        if not line.startswith("data:"):
            return self._partial(HTTP_ERROR, f"malformed stream line: {line[:200]!r}")
        data = line[5:].strip()
        if data == "[DONE]":
            if self.tokens == 0:
                return _result(HTTP_ERROR, "stream finished with no token")
            if self.check_answer and self.secret not in self.text:
                return self._partial(WRONG_ANSWER, f"tokens flowed but the answer lacks the code {self.secret}: "
                                                   f"{self.text!r}")
            return self._partial(OK, f"{self.tokens} tokens in {time.monotonic() - self.start:.2f}s, first after "
                                     f"{self.ttft:.2f}s; answer ok")
        try:
            obj = json.loads(data)
        except ValueError:
            return self._partial(HTTP_ERROR, f"malformed stream chunk: {data[:200]!r}")
        if not isinstance(obj, dict):
            return self._partial(HTTP_ERROR, f"malformed stream chunk: {data[:200]!r}")
        if "error" in obj:
            return self._partial(ABORTED, f"stream error: {json.dumps(obj['error'])[:300]}")
        meta = obj.get("meta_info") or {}
        fin = meta.get("finish_reason")
        if isinstance(fin, dict) and fin.get("type") == "abort":
            return self._partial(ABORTED, f"aborted by a worker ({fin.get('status_code')}): {fin.get('message')}")
        n = len(obj.get("output_ids") or []) or int(meta.get("completion_tokens") or 0)
        if n > self.tokens:
            now = time.monotonic()
            if self.ttft is None:
                self.ttft = now - self.start
            self.tokens, self.last_tok = n, now
        if isinstance(obj.get("text"), str):
            self.text = obj["text"]
        return None


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="router URL, e.g. http://127.0.0.1:8000 (with --pair: a decode's)")
    p.add_argument("--pair", nargs=3, metavar=("PREFILL_URL", "BOOTSTRAP_HOST", "BOOTSTRAP_PORT"),
                   help="probe one PD pair directly, as the router would: this prefill (its bootstrap address) and "
                   "the decode at --url (a server out of the router for a restart)")
    p.add_argument("--prefill", action="append", default=[], metavar="URL",
                   help="a prefill server's URL (repeatable): its queues attribute a missing first token")
    p.add_argument("--decode", action="append", default=[], metavar="URL",
                   help="a decode server's URL (repeatable): tells a wedged decode from a stuck prefill/transfer")
    p.add_argument("--first-token-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for the first token (prefill + KV transfer) (default 60)")
    p.add_argument("--stall-timeout", type=float, default=15.0, metavar="S",
                   help="seconds without a new token after the first before decode counts as stalled (default 15)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="whole-probe deadline (default 120)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--no-check-answer", action="store_true", help="do not require the code in the answer")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON ('-' for stdout)")
    p.epilog = "exit codes: " + ", ".join(f"{c} {s}" for c, s in STAGES.items())
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def run(args: argparse.Namespace) -> int:
    res = probe(args.url, first_token_timeout=args.first_token_timeout, stall_timeout=args.stall_timeout,
                total_timeout=args.timeout, max_new_tokens=args.max_new_tokens, prefill=args.prefill,
                decode=args.decode, check_answer=not args.no_check_answer,
                pair=(args.pair[0], args.pair[1], int(args.pair[2])) if args.pair else None)
    line = f"pdstack probe {args.url}: {'PASS' if res.ok else 'FAIL'} [{res.stage}, exit {res.code}] {res.message}"
    print(line, file=sys.stdout if res.ok else sys.stderr)
    if args.json:
        text = json.dumps(res.to_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    return res.code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pdstack-probe", allow_abbrev=False)
    register(p)
    try:
        return run(p.parse_args(argv))
    except socket.gaierror as e:  # a router name that does not resolve: the router is down, as far as a probe sees
        print(f"pdstack probe: {e}", file=sys.stderr)
        return ROUTER_DOWN


if __name__ == "__main__":
    sys.exit(main())
