"""What the test host modules share: labels, the error type, progress output, the docker client."""

from __future__ import annotations

import sys

from pdstack.controller.imagebuild import engine
from pdstack.errors import PdstackError

LABEL = "io.pdstack.testhost"
DEFAULT_PREFIX = "pdstack-local"


class TesthostError(PdstackError):
    """A local test host could not be built, booted or removed."""

    exit_code = 4


def echo(msg: str) -> None:
    """Progress for people, on stderr (stdout stays free for machine output)."""
    print(f"[testhost] {msg}", file=sys.stderr, flush=True)


def client():
    """A docker SDK client that has answered a ping (the controller's, pdstack.controller.imagebuild.engine)."""
    return engine.client()
