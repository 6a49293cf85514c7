"""The front door's optional API key, as the controller's tools send it (`pdstack smoke`, `recall`, `bench`, and the
smoke gate's probe, tool-call and churn checks).

roles/frontdoor makes HAProxy answer 401 to any request without `Authorization: Bearer KEY` when the inventory sets
`frontdoor_api_key` (Ansible Vault). The tools take the key from the environment, never from their command line
(it would show in `ps` and in shell history), and never write it anywhere:

    PDSTACK_API_KEY_FILE   a file that holds the key (one line), readable by its owner only (mode 0600 or 0400);
                           the smoke role writes one in a private temporary directory and removes it after the run
    PDSTACK_API_KEY        the key itself (for a person's shell; the smoke role uses the file, because Ansible
                           prints a task's environment at -vvv)

Neither set: no key is sent, as a deployment without one wants. A 401/403 from the front door is an access problem,
not a failing model: `refused()` says which, and every gate reports it with that message.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from pdstack.errors import PdstackError

ENV_FILE = "PDSTACK_API_KEY_FILE"
ENV = "PDSTACK_API_KEY"
REFUSED_STATUSES = (401, 403)  # HAProxy's answer to a missing or wrong key (401); 403 from a proxy in front of it


class ApiKeyError(PdstackError):
    """The API key the environment names cannot be used (missing file, too open, empty)."""

    exit_code = 2


def load(environ: Mapping[str, str] | None = None) -> str | None:
    """The key from PDSTACK_API_KEY_FILE (preferred) or PDSTACK_API_KEY; None when neither is set."""
    env = os.environ if environ is None else environ
    path = env.get(ENV_FILE, "")
    if path:
        p = Path(path)
        try:
            mode = p.stat().st_mode
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ApiKeyError(f"{ENV_FILE}={path}: cannot read the API key file ({e.strerror}); point it at the "
                              "file holding the front door's key, or unset it when the deployment has none") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ApiKeyError(f"{ENV_FILE}={path}: the API key file is mode {stat.S_IMODE(mode):04o}, readable by "
                              f"others; `chmod 600 {path}`")
        key = text.strip()
        if key.lower().startswith("bearer "):  # the front door's own file holds the whole header value
            key = key[7:].strip()
        if not key or "\n" in key:
            raise ApiKeyError(f"{ENV_FILE}={path}: the file must hold the key on one line (it is "
                              f"{'empty' if not key else 'several lines'})")
        return key
    key = env.get(ENV, "").strip()
    return key or None


def headers(key: str | None) -> dict[str, str]:
    """The request headers that carry `key` ({} without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """headers(load()): what the CLIs send with every request."""
    return headers(load(environ))


def refused(status: int | None, sent: Mapping[str, str] | None) -> str | None:
    """For a 401/403: the message every gate reports (whether a key was sent, and what to do); None otherwise."""
    if status not in REFUSED_STATUSES:
        return None
    if sent and "Authorization" in sent:
        why = (f"the key sent (from {ENV_FILE} or {ENV}) is not one it accepts: give the deployment's "
               "frontdoor_api_key")
    else:
        why = (f"no key was sent and the deployment requires one (frontdoor_api_key): put it in a mode-0600 file "
               f"named by {ENV_FILE} (the smoke role does), or in {ENV}")
    return f"the front door refused the API key (HTTP {status}): {why}. An access problem, not a model failure"
