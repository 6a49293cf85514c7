"""Role hygiene that linters do not check: defaults and argument_specs agree, templates carry ansible_managed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_and_argument_specs_agree(role: Path):
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    documented = set(specs["main"].get("options") or {})
    assert set(defaults or {}) == documented, (
        f"{role.name}: defaults/main.yml and meta/argument_specs.yml disagree: only in defaults "
        f"{sorted(set(defaults) - documented)}, only in specs {sorted(documented - set(defaults))}")
    for name in defaults or {}:
        assert name.startswith(f"{role.name}_"), f"{role.name}: public variable {name} lacks the role prefix"
        assert specs["main"]["options"][name].get("description"), f"{role.name}: {name} is undocumented"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_are_commented(role: Path):
    f = role / "defaults" / "main.yml"
    if not f.exists():
        return
    lines = f.read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")):
            assert i > 0 and lines[i - 1].startswith("#"), f"{role.name}: '{line}' has no comment above it"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_templates_start_with_ansible_managed(role: Path):
    for t in (role / "templates").rglob("*.j2") if (role / "templates").exists() else []:
        assert "ansible_managed" in t.read_text().splitlines()[0], t
