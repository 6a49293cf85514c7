"""Role hygiene that linters do not check: defaults and argument_specs agree, templates carry ansible_managed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())


def _specs(role: Path) -> dict:
    return yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_and_argument_specs_agree(role: Path):
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else {}
    specs = _specs(role)
    # every entry point's options (preflight has no `main`: each of its steps is one), less the required parameters
    # of an entry point, which have no default by design (wait_ready_url)
    options = {name: o for ep in specs.values() for name, o in (ep.get("options") or {}).items()}
    documented = {name for name, o in options.items() if not o.get("required")}
    assert set(defaults or {}) == documented, (
        f"{role.name}: defaults/main.yml and meta/argument_specs.yml disagree: only in defaults "
        f"{sorted(set(defaults) - documented)}, only in specs {sorted(documented - set(defaults))}")
    for name in options:
        assert name.startswith(f"{role.name}_"), f"{role.name}: public variable {name} lacks the role prefix"
        assert options[name].get("description"), f"{role.name}: {name} is undocumented"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_a_roles_plan_input_points_at_the_plan_schema(role: Path):
    for ep in _specs(role).values():
        o = (ep.get("options") or {}).get(f"{role.name}_plan")
        if o:
            assert "pdstack/controller/plan/plan.schema.json" in o["description"], f"{role.name}_plan: name the schema"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_entry_point_has_its_tasks_file(role: Path):
    for ep in _specs(role):
        assert (role / "tasks" / f"{ep}.yml").exists(), f"{role.name}: argument_specs entry {ep} has no tasks/{ep}.yml"
    if not (role / "tasks" / "main.yml").exists():
        assert "main" not in _specs(role), role.name


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_each_role_has_a_readme_naming_every_public_variable_and_entry_point(role: Path):
    readme = role / "README.md"
    assert readme.exists(), f"{role.name}: no README.md"
    text = readme.read_text()
    assert text.startswith(f"# Role `{role.name}`"), f"{readme}: should start with '# Role `{role.name}`'"
    specs = _specs(role)
    for ep in specs.values():
        for name in ep.get("options") or {}:
            assert f"`{name}`" in text, f"{readme}: does not document `{name}`"
    for ep in specs:
        if ep != "main":
            assert f"tasks_from: {ep}" in text, f"{readme}: does not describe entry point `tasks_from: {ep}`"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_private_variables_stay_inside_their_role(role: Path):
    """STYLE.md: registered/private variables are `__<role>_*`, and no other role or playbook reads them."""
    own = f"__{role.name}_"
    for f in role.rglob("*"):
        if f.suffix in (".yml", ".j2"):
            for var in set(re.findall(r"\b__[a-z][a-z0-9_]*", f.read_text())) - {"__init__"}:
                assert var.startswith(own), f"{f.relative_to(ROOT)}: {var} is not {own}* (a private variable of " \
                                            "another role, or unprefixed)"


def test_playbooks_read_no_role_private_variables():
    for f in sorted((ROOT / "playbooks").glob("*.yml")):
        own = f"__{f.stem}_"
        for var in set(re.findall(r"\b__[a-z][a-z0-9_]*", f.read_text())):
            assert var.startswith(own), f"playbooks/{f.name}: {var} belongs to a role (use its public output)"


def test_playbook_phase_numbers_follow_site_order():
    site = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    order = [p["ansible.builtin.import_playbook"] for p in site]
    phases = [f for f in order if (ROOT / "playbooks" / f).read_text().startswith("---\n# Phase ")]
    for n, f in enumerate(phases, start=1):
        head = (ROOT / "playbooks" / f).read_text().splitlines()[1]
        assert head.startswith(f"# Phase {n}:"), f"playbooks/{f}: says {head!r}, but it is phase {n} in site.yml"


def test_layout_doc_lists_every_role():
    doc = (ROOT / "docs" / "layout.md").read_text()
    layout = doc[doc.index("## The repository"):]
    for role in ROLES:
        assert f"\n  {role.name}/ " in layout, f"docs/layout.md's repository tree does not list role {role.name}"


def test_role_readmes_give_the_phase_of_the_playbook_they_name():
    """A role README that opens with "Phase N (`playbooks/X.yml`" is held to site.yml's order (README drift)."""
    order = re.findall(r"import_playbook: (\w+)\.yml", (ROOT / "playbooks" / "site.yml").read_text())
    checked, wrong = 0, []
    for readme in sorted((ROOT / "roles").glob("*/README.md")):
        for n, pb in re.findall(r"Phase (\d+) \(`playbooks/(\w+)\.yml`", readme.read_text()):
            checked += 1
            assert pb in order, f"{readme.relative_to(ROOT)} names playbooks/{pb}.yml, which site.yml does not run"
            if int(n) != order.index(pb) + 1:
                wrong.append(f"{readme.relative_to(ROOT)}: Phase {n}, but playbooks/{pb}.yml is phase "
                             f"{order.index(pb) + 1}")
    assert checked >= 10, "the role READMEs state their phase"
    assert not wrong, "\n".join(wrong)


def test_host_code_reaches_the_hosts_only_as_the_artifact():
    """One way to ship host code: the host-side artifact (built by the preflight, installed by roles/hostside). No
    role links, copies or runs pdstack's source files: no symlink under roles/, no path from a role up into the
    package (`role_path/../../pdstack`), no task or unit that names a pdstack/hostside module to copy or run."""
    links = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "roles").rglob("*") if p.is_symlink())
    assert not links, f"symlinks under roles/: {links}"
    up = re.compile(r"\.\./pdstack\b")
    run = re.compile(r"(\bsrc:|\bcmd:|\bargv\b|ExecStart=|command=)[^\n]*(pdstack/hostside/|pdstack\.hostside)|"
                     r"-m\s+pdstack\.hostside")
    bad = []
    for f in sorted((ROOT / "roles").rglob("*")):
        if f.is_file() and f.suffix in (".yml", ".j2", ".py", ".sh", ".cfg"):
            for n, line in enumerate(f.read_text().splitlines(), start=1):
                if up.search(line) or run.search(line):
                    bad.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "host code shipped other than as the artifact:\n" + "\n".join(bad)
    # and the roles that run host code run the installed artifact, one command each
    uses = {"facts/templates/etc/ansible/facts.d/pdstack.fact.j2": "{{ facts_hostside.path }} facts",
            "facts/tasks/read.yml": "{{ facts_hostside.artifact | quote }} facts",
            "serving/tasks/restart.yml": '"{{ serving_hostside.path }}", drain]',
            "watchdog/templates/etc/systemd/system/pdstack-watchdog.service.j2":
                "{{ watchdog_hostside.path }} watchdog",
            "watchdog_access/tasks/authorize.yml": "{{ watchdog_access_hostside.path }} restart-unit",
            "model/tasks/tokenizer.yml": "model_hostside.artifact, 'model-fetch'"}
    for f, use in uses.items():
        assert use in (ROOT / "roles" / f).read_text(), (f, use)
