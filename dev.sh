#!/usr/bin/env bash
# pdstack developer entry point: installs what the repo needs (idempotently), then runs a job.
#
#   ./dev.sh demo     build the images, boot the local test host(s), run site.yml against them,
#                     run the smoke checks and print the summary
#   ./dev.sh test     lint (ruff, yamllint, ansible-lint) and the whole test suite, integration included
#   ./dev.sh setup    only install (apt packages, the venv, Ansible collections, dockerd)
#
# Meant for a Debian 12 machine as root (a fresh one works; only package registries need to be reachable).
# Every step checks before it acts, so a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
COLLECTIONS="$ROOT/.collections"
ANSIBLE_WHEEL_VERSION=12.3.0   # the PyPI `ansible` release whose wheel carries the collections we extract
COLLECTIONS_USED="ansible/posix community/general"

log() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31m[dev.sh] %s\033[0m\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_packages() {
  # debootstrap: the local test hosts' base; docker.io: the engine for builds and test hosts;
  # prometheus: promtool for rule/config tests; haproxy: the front door's loopback tests (haproxy -c, real admission);
  # nftables: `nft -c` of the host firewall's script; docker-registry: the registry the image phase's pull test
  # pushes to and pulls from (Docker Hub is unreachable, so no registry image);
  # iproute2/numactl: host facts; python3-venv: the venv; nginx: the local model mirror the sim inventories'
  # model phase fetches from (pdstack/testing/mirror.py); rsync: the model phase's rsync source.
  local want=(python3 python3-venv python3-dev gcc git patch openssh-client debootstrap docker.io docker-registry prometheus prometheus-node-exporter haproxy nftables iproute2 numactl curl ca-certificates rsync nginx)
  local missing=()
  for p in "${want[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # The Debian prometheus, haproxy, docker-registry and nginx packages start their own servers; pdstack's tests run
    # their own.
    as_root systemctl disable --now prometheus prometheus-node-exporter haproxy docker-registry nginx >/dev/null 2>&1 || true
  fi
}

ensure_dockerd() {
  if as_root docker info >/dev/null 2>&1; then return; fi
  command -v dockerd >/dev/null || die "dockerd is not installed; run: apt-get install docker.io"
  log "docker: starting dockerd (log: /var/log/pdstack-dockerd.log)"
  if [ -d /run/systemd/system ]; then  # booted with systemd (degraded counts too)
    as_root systemctl start docker || true
  fi
  if ! as_root docker info >/dev/null 2>&1; then
    # its own session, so it outlives this script's process group (CI kills a step's group when it ends)
    as_root sh -c 'setsid -f dockerd >>/var/log/pdstack-dockerd.log 2>&1 </dev/null'
  fi
  for _ in $(seq 1 60); do as_root docker info >/dev/null 2>&1 && return; sleep 1; done
  die "dockerd did not come up in 60 s; see /var/log/pdstack-dockerd.log"
}

python_for_venv() {
  # Prefer a CPython 3.11 (the pinned torch/sglang wheels are built for it); Debian 12's python3 is 3.11.
  for c in python3.11 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$c"; return
    fi
  done
  die "pdstack needs Python 3.11 (Debian 12's python3); none found"
}

ensure_venv() {
  local stamp="$VENV/.pdstack-requirements"
  local want
  want=$(cat requirements/lock.txt requirements/sglang.txt pyproject.toml | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  if [ ! -x "$VENV/bin/python" ]; then
    log "venv: creating $VENV"
    "$(python_for_venv)" -m venv "$VENV"
  fi
  log "venv: installing pinned requirements (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install -q "pip==26.3"
  # --no-compile: Python writes each module's bytecode when it is first imported; most of torch, transformers and
  # sglang is never imported here, and compiling all of it up front is most of a fresh venv's install time
  # the lock carries every package with its sha256 (invoke lock.dev); the project itself goes in without deps, as an
  # editable install has no hash to check
  "$VENV/bin/python" -m pip install -q --no-compile --require-hashes -r requirements/lock.txt
  "$VENV/bin/python" -m pip install -q --no-compile --no-deps -r requirements/sglang.txt
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
}

ensure_zipimport_cache() {
  # The localhost tasks of every playbook run import Ansible's module_utils from a zip, which Python never caches:
  # pdstack/testing/testhost/zipimport_cache.py (the test hosts have it too) caches that bytecode for the venv.
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$VENV/bin/python" -c 'import sys; from pdstack.testing.testhost import zipimport_cache as z
if z.install_into(sys.argv[1], sys.argv[2]): print(f"[dev.sh] zipimport cache: installed into {sys.argv[1]}", file=sys.stderr)' \
    "$site" "$VENV/zipimport-cache"
}

ensure_collections() {
  # Galaxy is unreachable; the `ansible` wheel on PyPI carries the collections. Extract only those we use.
  local stamp="$COLLECTIONS/.pdstack-$ANSIBLE_WHEEL_VERSION"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$COLLECTIONS_USED" ] && return
  log "ansible: extracting collections ($COLLECTIONS_USED) from ansible==$ANSIBLE_WHEEL_VERSION"
  local tmp
  tmp=$(mktemp -d)
  "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "ansible==$ANSIBLE_WHEEL_VERSION"
  rm -rf "$COLLECTIONS"
  mkdir -p "$COLLECTIONS/ansible_collections"
  local pats=()
  for c in $COLLECTIONS_USED; do pats+=("ansible_collections/$c/*"); done
  (cd "$COLLECTIONS" && "$VENV/bin/python" - "$tmp"/ansible-*.whl "${pats[@]}" <<'EOF'
import fnmatch, sys, zipfile
whl, pats = sys.argv[1], sys.argv[2:]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if any(fnmatch.fnmatch(n, p) for p in pats)]
    z.extractall(".", names)
print(f"extracted {len(names)} files", file=sys.stderr)
EOF
  )
  rm -rf "$tmp"
  echo "$COLLECTIONS_USED" > "$stamp"
}

setup() {
  apt_packages
  ensure_venv
  ensure_zipimport_cache
  ensure_collections
  ensure_dockerd
  export PATH="$VENV/bin:$PATH"
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  demo)  setup; exec "$VENV/bin/invoke" demo "$@" ;;
  test)  # the suite's wall time, setup included, is the last line (CI's guard: .ci/run runs exactly this)
         start=$(date +%s); rc=0
         setup; "$VENV/bin/invoke" test "$@" || rc=$?
         secs=$(( $(date +%s) - start ))
         log "$(printf 'test: exit %d, wall %d min %02d s' "$rc" $((secs / 60)) $((secs % 60)))"
         exit "$rc" ;;
  *) die "usage: ./dev.sh demo|test|setup" ;;
esac
