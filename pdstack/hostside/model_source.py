"""Where the model fetcher's files come from (pdstack/hostside/model_fetch.py; stdlib only): http(s) with Range
resume and retries (the token only to the host it was meant for), a local path, rsync; one file into its .part in
staging, checked against the lock, then placed."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from pdstack.hostside.model_store import (
    BAD,
    CHUNK,
    FIX_LOCK,
    FIX_SOURCE,
    FLUSH_S,
    RETRIES,
    RSYNC_TRANSIENT,
    SOURCE,
    SPACE,
    TIMEOUT_S,
    USER_AGENT,
    Entry,
    Failed,
    Run,
    Transient,
    kept_bytes,
    part_path,
    place,
)


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows redirects; the Authorization header goes only to the host it was meant for (a Hugging Face resolve
    URL redirects to a CDN that must not see the token: huggingface_hub and requests drop it the same way)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not _keeps_auth(req.full_url, new.full_url):
            new.remove_header("Authorization")
        return new


def _keeps_auth(old: str, new: str) -> bool:
    """requests' rule: the same host, scheme and port, or http:80 -> https:443 on the same host."""
    o, n = urllib.parse.urlsplit(old), urllib.parse.urlsplit(new)
    ports = {"http": 80, "https": 443}
    op, np_ = o.port or ports.get(o.scheme), n.port or ports.get(n.scheme)
    if o.hostname != n.hostname:
        return False
    return (o.scheme, op) == (n.scheme, np_) or (o.scheme, op, n.scheme, np_) == ("http", 80, "https", 443)


def _public(url: str) -> str:
    """The URL to show: no credentials, no query (a signed CDN URL's query is one)."""
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc.rpartition("@")[2], u.path, "", ""))


class _Part:
    """One file's .part in staging: appended to as the source sends it, hashed on the way (not read again)."""

    def __init__(self, run: Run, e: Entry, path: str, kept: int):
        self.run, self.e, self.path = run, e, path
        self.h, self.n = hashlib.sha256(), 0
        if kept:  # the bytes an earlier run left: hash them first, then append
            with open(path, "rb") as f:
                while self.n < kept and (chunk := f.read(min(CHUNK, kept - self.n))):
                    self.h.update(chunk)
                    self.n += len(chunk)
            run.count("hashed_bytes", self.n)
        self.prior = self.n  # of them, what the file ends up with (0 once the source starts over)
        self.f = open(path, "ab")

    def restart(self) -> None:
        """The source sends the file from its first byte: what the .part held is thrown away."""
        self.run.count("bytes_restarted", self.n)
        self.run.set_have(self.e.path, 0)
        self.f.truncate(0)
        self.h, self.n, self.prior = hashlib.sha256(), 0, 0

    def pump(self, read: Callable[[], bytes]) -> None:
        """Append what `read()` returns until it returns b"" (or more than the lock's size came)."""
        buf, last = bytearray(), time.monotonic()
        while self.n + len(buf) <= self.e.size:
            try:
                data = read()
            except (OSError, http.client.HTTPException) as err:
                self._land(buf)  # what came before the failure is good: the next attempt resumes after it
                raise Transient(str(err) or type(err).__name__) from None
            if not data:
                break
            buf += data
            if len(buf) >= CHUNK or time.monotonic() - last >= FLUSH_S:
                self._land(buf)
                buf, last = bytearray(), time.monotonic()
        self._land(buf)

    def _land(self, buf: bytearray) -> None:
        if buf:
            self.f.write(buf)
            self.f.flush()  # in the kernel's hands: a SIGKILL after this keeps the bytes
            self.h.update(buf)
            self.n += len(buf)
            self.run.count("bytes_fetched", len(buf), self.e.path)

    def close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


class Source:
    """Where the files come from (--source, --from) and how one file gets into its .part."""

    def __init__(self, kind: str, origin: str, token: str | None):
        self.kind, self.origin, self.token = kind, origin, token
        if kind == "http":
            u = urllib.parse.urlsplit(origin)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise Failed(f"--from {_public(origin)!r} is not an http(s) URL; {FIX_SOURCE}", SOURCE)
            self.opener = urllib.request.build_opener(_RedirectHandler)
        elif kind == "path" and not os.path.isdir(origin):
            raise Failed(f"--from {origin}: no such directory; {FIX_SOURCE}", SOURCE)

    def get(self, run: Run, e: Entry, path: str, kept: int) -> tuple[str, int, int]:
        """Complete the .part at `path` (holding `kept` bytes): its sha256, its size, the bytes kept from before."""
        if self.kind == "rsync":
            return self._rsync(run, e, path, kept)
        p = _Part(run, e, path, kept)
        try:
            if p.n < e.size:  # else complete already: only the caller's check
                (self._http if self.kind == "http" else self._path)(e, p)
        finally:
            p.close()
        return p.h.hexdigest(), p.n, p.prior

    def _http(self, e: Entry, p: _Part) -> None:
        url = f"{self.origin.rstrip('/')}/{urllib.parse.quote(e.path)}"
        shown, failures = _public(url), 0
        while True:
            before = p.n
            try:
                return self._http_once(e, p, url, shown)
            except Transient as err:
                failures = 0 if p.n > before else failures + 1  # a flaky link that moves bytes keeps going
                if failures > RETRIES:
                    raise Failed(f"{e.path}: GET {shown} failed {failures} times in a row ({err}); {FIX_SOURCE}",
                                 SOURCE) from None
                time.sleep(2 ** max(failures - 1, 0))

    def _http_once(self, e: Entry, p: _Part, url: str, shown: str) -> None:
        headers = {"User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if p.n:
            headers["Range"] = f"bytes={p.n}-"
        try:
            resp = self.opener.open(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
        except urllib.error.HTTPError as err:
            err.close()
            if err.code == 416 and p.n:  # the source's file is shorter than the .part: start over
                p.restart()
                raise Transient("416 Range Not Satisfiable") from None
            if err.code >= 500 or err.code in (408, 429):
                raise Transient(f"{err.code} {err.reason}") from None
            hint = " and the token (--auth-env, pdstack_model.source.token_var)" if err.code in (401, 403) else ""
            raise Failed(f"{e.path}: GET {shown} answered {err.code} {err.reason}; {FIX_SOURCE}{hint}",
                         SOURCE) from None
        except (OSError, http.client.HTTPException) as err:
            reason = err.reason if isinstance(err, urllib.error.URLError) else err
            raise Transient(str(reason) or type(err).__name__) from None
        with resp:
            self._answer(e, p, resp, shown)
            p.pump(lambda: resp.read1(CHUNK))  # read1: what has arrived, not a whole MiB on a slow link
            if resp.length and p.n < e.size:  # http.client ends a cut-off body quietly; the length it expected tells
                raise Transient(f"the connection closed {resp.length} bytes before the end")

    def _answer(self, e: Entry, p: _Part, resp, shown: str) -> None:
        if resp.status == 206:
            m = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", (resp.headers.get("Content-Range") or "").strip())
            if not m or int(m[1]) != p.n:
                p.restart()
                raise Transient(f"a Range answer from another offset ({resp.headers.get('Content-Range')})")
            served = None if m[2] == "*" else int(m[2])
        elif resp.status == 200:
            if p.n:
                p.restart()  # the source ignores Range: the whole file again
            served = resp.length
        else:
            raise Failed(f"{e.path}: GET {shown} answered {resp.status} {resp.reason}; {FIX_SOURCE}", SOURCE)
        if served is not None and served != e.size:
            raise Failed(f"{e.path}: the source serves {served} bytes ({shown}), the lock says {e.size} bytes; "
                         f"{FIX_LOCK}", BAD)

    def _path(self, e: Entry, p: _Part) -> None:
        src = os.path.join(self.origin, *e.path.split("/"))
        try:
            f = open(src, "rb")
        except OSError as err:
            raise Failed(f"{e.path}: {src}: {err.strerror}; {FIX_SOURCE}", SOURCE) from None
        with f:
            served = os.fstat(f.fileno()).st_size
            if served != e.size:
                raise Failed(f"{e.path}: the source serves {served} bytes ({src}), the lock says {e.size} bytes; "
                             f"{FIX_LOCK}", BAD)
            f.seek(p.n)
            try:
                p.pump(lambda: f.read(CHUNK))
            except Transient as err:
                raise Failed(f"{e.path}: reading {src}: {err}; {FIX_SOURCE}", SOURCE) from None

    def _rsync(self, run: Run, e: Entry, path: str, kept: int) -> tuple[str, int, int]:
        src = f"{self.origin.rstrip('/')}/{e.path}"
        # --append-verify resumes the .part (and sends it whole again when the appended file fails rsync's check);
        # F644: a read-only source file must not make the .part unwritable for the next resume
        cmd = ["rsync", "--partial", "--append-verify", "--chmod=F644", f"--timeout={TIMEOUT_S}", "--", src, path]
        with run.mu:
            run.watch[e.path] = path
        try:
            for attempt in range(RETRIES + 1 if kept < e.size else 0):
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
                except FileNotFoundError:
                    raise Failed("rsync is not installed on this host (apt-get install rsync)", SOURCE) from None
                if r.returncode == 0:
                    break
                if r.returncode not in RSYNC_TRANSIENT or attempt == RETRIES:
                    tail = " ".join(r.stderr.split())[-400:]
                    raise Failed(f"{e.path}: rsync {src} exited {r.returncode}: {tail}; {FIX_SOURCE}", SOURCE)
                time.sleep(2 ** attempt)
        finally:
            with run.mu:
                run.watch.pop(e.path, None)
        h, n = hashlib.sha256(), 0
        with open(path, "rb") as f:  # rsync wrote it: read it back once
            while chunk := f.read(CHUNK):
                h.update(chunk)
                n += len(chunk)
            os.fsync(f.fileno())
        run.count("hashed_bytes", n)
        run.count("bytes_fetched", max(n - kept, 0))
        return h.hexdigest(), n, min(kept, n)


def fetch_file(run: Run, src: Source, e: Entry) -> None:
    part = part_path(run.staging, e)
    try:
        os.makedirs(os.path.dirname(part), 0o755, exist_ok=True)
        for fresh in (False, True):
            if fresh:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                run.set_have(e.path, 0)
            digest, n, resumed = src.get(run, e, part, kept_bytes(part, e.size, drop=True))
            if n == e.size and digest == e.sha256:
                break
            if resumed and not fresh:  # the kept bytes may be an earlier source's or revision's: once from 0
                run.count("bytes_restarted", resumed)
                continue
            served = f"{n} bytes" if n <= e.size else f"over {e.size} bytes"
            raise Failed(f"{e.path}: the source served sha256 {digest[:12]}… ({served}), the lock says "
                         f"{e.sha256[:12]}… ({e.size} bytes); {FIX_LOCK}", BAD)
        run.count("bytes_resumed", resumed)
        place(run, e, part)
    except Failed as err:
        if err.code == BAD:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
        raise
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise Failed(f"{e.path}: no space left on the device of {run.dest} while writing {part}", SPACE) from None
        raise Failed(f"{e.path}: {err}", 1) from None
