"""A bytecode cache for modules Python imports from a zip file, installed into the TEST HOSTS' Python and the
controller venv that ./dev.sh makes.

Why: Ansible sends every module as an AnsiballZ payload, a zip of the module and its module_utils that the host's
Python imports with zipimport, which never caches bytecode (CPython 3.11 Lib/zipimport.py, _compile_source): every
task compiles ansible.module_utils.basic and ~55 more files again. On a test host (python3 3.11.2) one `ping`
payload took 152-175 ms, 86-98 ms with this cache (median and best of 15, measured with
`python3 AnsiballZ_ping.py` inside the host, the payload kept by ANSIBLE_KEEP_REMOTE_FILES=1). The test suite runs
thousands of tasks against test hosts; production hosts do not get this file.
The controller runs ~40 tasks of every site.yml run on localhost, with the venv's Python and the same zip imports:
`./dev.sh` installs the cache into its venv too (install_into below; the cache in .venv/zipimport-cache).
Measured on a no-change run of inventory/test/one-host (2 cores): a localhost module 0.26 -> 0.19 s of CPU, the
run's CPU on the whole machine 62.9 -> 57.5-59.5 s.

How: the base image (baseimage.py) puts this file into /usr/lib/python3/dist-packages with a .pth line that imports
it, so every `python3` on the host replaces zipimport._compile_source with one that keys the compiled code by the
interpreter's magic number and the source's sha256 (the payload's zip path differs every run, so the path is not
part of the key; each loaded code object gets the path it was imported from, for tracebacks). Anything unexpected
(no cache directory, a short or foreign file) falls back to compiling, as zipimport does without it. Standard
library only, no effect on imports from files.
"""

from __future__ import annotations

import marshal
import os
import zipimport

CACHE_DIR = "/var/cache/pdstack-zipimport"
MODULE = "pdstack_zipimport_cache"  # its name on the host (baseimage.py)
_compile = zipimport._compile_source
_code_type = type(_compile.__code__)


def _with_filename(code, filename: str):
    consts = tuple(_with_filename(c, filename) if isinstance(c, _code_type) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _key(source: bytes) -> str:
    import hashlib  # here, not at start-up: every python3 on the host imports this module
    from importlib.util import MAGIC_NUMBER

    return hashlib.sha256(MAGIC_NUMBER + b"\0" + source).hexdigest()


def compile_source(pathname: str, source: bytes):
    """zipimport._compile_source with the cache: the same code object, compiled at most once per source."""
    cache_dir = CACHE_DIR
    path = os.path.join(cache_dir, _key(source))
    try:
        with open(path, "rb") as f:
            code = marshal.loads(f.read())
        if isinstance(code, _code_type):
            return _with_filename(code, pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile(pathname, source)
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(marshal.dumps(code))
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    except OSError:
        pass
    return code


def install() -> None:
    zipimport._compile_source = compile_source


def install_into(site_dir: str, cache_dir: str) -> bool:
    """Put this file (as MODULE) and a .pth line that imports it, with `cache_dir` as its CACHE_DIR, into `site_dir`
    (a venv's site-packages). Idempotent: True when it wrote anything."""
    files = {f"{MODULE}.py": open(__file__, encoding="utf-8").read(),
             f"{MODULE}.pth": f"import {MODULE}; {MODULE}.CACHE_DIR = {os.path.abspath(cache_dir)!r}\n"}
    changed = False
    for name, text in files.items():
        path = os.path.join(site_dir, name)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    continue
        except OSError:
            pass
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        changed = True
    return changed


if __name__ == MODULE:  # imported by a .pth line (the host's, the venv's), not when a test imports this file
    install()
