"""Role and playbook hygiene that linters do not check: defaults, argument_specs and each README's variable table
agree, templates carry ansible_managed, every phase playbook runs alone."""

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


def _readme_default(value) -> str:
    """A default as the role READMEs' variable tables write it: in backticks (a `|` escaped for the table), YAML's
    true/false, `""` for an empty string, a list item by item (`[]` when empty)."""
    if isinstance(value, list) and value:
        return ", ".join(_readme_default(v) for v in value)
    text = {True: "true", False: "false", "": '""'}.get(value, value) if isinstance(value, (bool, str)) else value
    return f"`{text}`".replace("|", "\\|")


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_a_roles_readme_variable_table_is_its_argument_specs_with_the_defaults(role: Path):
    """The README's `| variable | default | ... |` table lists exactly the argument_specs options (every entry
    point's), each with its defaults/main.yml value, or `required` for a required parameter."""
    text = (role / "README.md").read_text()
    tables = re.findall(r"^\| variable \| default \| \w+ \|\n\|---\|---\|---\|\n((?:\|.*\n?)*)", text, re.M)
    assert len(tables) == 1, f"{role.name}/README.md: {len(tables)} variable tables, want one"
    rows = {}
    for line in tables[0].splitlines():
        m = re.match(r"^\| `(\w+)` \| (.*?) \| .* \|$", line)
        assert m, f"{role.name}/README.md: not a `| `name` | default | what |` row: {line[:100]}"
        assert m[1] not in rows, f"{role.name}/README.md: {m[1]} listed twice"
        rows[m[1]] = m[2]
    options = {name: o for ep in _specs(role).values() for name, o in (ep.get("options") or {}).items()}
    assert set(rows) == set(options), (f"{role.name}/README.md's variable table and meta/argument_specs.yml disagree: "
                                       f"only in the README {sorted(set(rows) - set(options))}, only in the specs "
                                       f"{sorted(set(options) - set(rows))}")
    defaults_file = role / "defaults" / "main.yml"
    defaults = (yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else None) or {}
    for name, o in options.items():
        want = "required" if o.get("required") else _readme_default(defaults[name])
        assert rows[name] == want, f"{role.name}/README.md: {name}'s default is {rows[name]}, defaults/main.yml {want}"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_private_variables_stay_inside_their_role(role: Path):
    """STYLE.md: registered/private variables are `__<role>_*`, and no other role or playbook reads them."""
    own = f"__{role.name}_"
    for f in role.rglob("*"):
        if f.suffix in (".yml", ".j2"):
            for var in set(re.findall(r"\b__[a-z][a-z0-9_]*", f.read_text())) - {"__init__"}:
                assert var.startswith(own), f"{f.relative_to(ROOT)}: {var} is not {own}* (a private variable of " \
                                            "another role, or unprefixed)"


def test_templates_start_with_ansible_managed():
    templates = sorted((ROOT / "roles").glob("*/templates/**/*.j2"))
    assert templates
    for f in templates:
        lines = f.read_text().splitlines()
        head = lines[1] if lines[0].startswith("#!") else lines[0]  # a script's shebang must stay its first line
        assert "ansible_managed" in head, f"{f.relative_to(ROOT)}: its first line does not carry ansible_managed"


def test_playbooks_read_no_role_private_variables():
    for f in sorted((ROOT / "playbooks").rglob("*.yml")):
        own = f"__{f.stem}_"
        for var in set(re.findall(r"\b__[a-z][a-z0-9_]*", f.read_text())):
            assert var.startswith(own), f"{f.relative_to(ROOT)}: {var} belongs to a role (use its public output)"


def test_playbook_phase_numbers_follow_site_order():
    site = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    order = [p["ansible.builtin.import_playbook"] for p in site]
    phases = [f for f in order if (ROOT / "playbooks" / f).read_text().startswith("---\n# Phase ")]
    for n, f in enumerate(phases, start=1):
        head = (ROOT / "playbooks" / f).read_text().splitlines()[1]
        assert head.startswith(f"# Phase {n}:"), f"playbooks/{f}: says {head!r}, but it is phase {n} in site.yml"


def test_every_phase_playbook_imports_the_preflight_first_and_site_runs_each():
    """`ansible-playbook playbooks/<phase>.yml` runs alone: it imports preflight.yml (the checks, the facts and the
    plan every role reads), then the phase's own plays (playbooks/phases/<phase>.yml). site.yml imports the preflight
    once and then every phase, in playbooks/phases/ order of its own; no preflight play can be skipped by a variable
    (a `when:` or `end_play` on one would let `-e` bypass the checks)."""
    phases = sorted(f.name for f in (ROOT / "playbooks" / "phases").glob("*.yml"))
    site = [p["ansible.builtin.import_playbook"] for p in yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())]
    assert site[0] == "preflight.yml" and sorted(site[1:]) == [f"phases/{f}" for f in phases], site
    runs_host_code = {"model.yml", "serving.yml", "watchdog.yml"}  # their roles run the host-side artifact
    for name in phases:
        wrapper = yaml.safe_load((ROOT / "playbooks" / name).read_text())
        want = ["preflight.yml", *(["hostside.yml"] * (name in runs_host_code)), f"phases/{name}"]
        assert [p.get("ansible.builtin.import_playbook") for p in wrapper] == want, f"playbooks/{name}"
    first = yaml.safe_load((ROOT / "playbooks" / "phases" / "facts.yml").read_text())[0]
    assert first.get("ansible.builtin.import_playbook") == "../hostside.yml", "site.yml's facts phase installs it"
    rollback = yaml.safe_load((ROOT / "playbooks" / "rollback.yml").read_text())
    assert rollback[0].get("ansible.builtin.import_playbook") == "preflight.yml", "playbooks/rollback.yml"
    for play in yaml.safe_load((ROOT / "playbooks" / "preflight.yml").read_text()):
        assert "always" in play["tags"], f"{play['name']}: not tagged always (a --tags run needs the plan)"
        assert "when" not in play and all("when" not in t and "ansible.builtin.meta" not in t
                                          for t in play["tasks"]), f"{play['name']}: a task a variable can skip"
    others = {f.name for f in (ROOT / "playbooks").glob("*.yml")} - {"site.yml", "preflight.yml", "hostside.yml",
                                                                      "rollback.yml"}
    assert others == set(phases), f"playbooks/ without a phase in playbooks/phases/: {others ^ set(phases)}"


def test_layout_doc_lists_every_role():
    doc = (ROOT / "docs" / "layout.md").read_text()
    layout = doc[doc.index("## The repository"):]
    for role in ROLES:
        assert f"\n  {role.name}/ " in layout, f"docs/layout.md's repository tree does not list role {role.name}"


def test_role_readmes_give_the_phase_of_the_playbook_they_name():
    """A role README that opens with "Phase N (`playbooks/X.yml`" is held to site.yml's order (README drift)."""
    order = re.findall(r"import_playbook: (?:phases/)?(\w+)\.yml", (ROOT / "playbooks" / "site.yml").read_text())
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
