"""What Ansible may read as an inventory, restricted to the sources pdstack supports; everything else refused by name.

pdstack supports one shape of inventory, a directory of:

  hosts.yml (or any *.yml, *.yaml, *.json)   read by Ansible's `yaml` inventory plugin
  group_vars/, host_vars/                      read by Ansible's `host_group_vars` vars plugin (.yml, .yaml, .json,
                                               or no extension)
  files Ansible ignores by their extension     (.md, .txt, .rst, .orig, .bak, .ini, .cfg, ...; hidden files)

Ansible itself reads more: an INI file or one without an extension beside hosts.yml (the `ini` and `yaml`
plugins), an executable file (the `script` plugin runs it), every subdirectory as further inventory, and vars files
with the extensions of ANSIBLE_YAML_FILENAME_EXT. The repository's ansible.cfg enables only the `yaml` inventory
plugin ([inventory] enable_plugins), and pdstack refuses, before anything reads the inventory: any other entry of the
inventory directory (naming it), and an Ansible configuration (environment or config file) that enables other
inventory or vars plugins, other vars-file extensions, another variable precedence or hash_behaviour = merge,
naming the setting and where it came from
(`ansible-config dump --only-changed` shows the same). pdstack's own reading (load/inventory.py) then uses Ansible's
loaders with exactly these plugins, so no inventory script runs during `pdstack preflight` or `pdstack plan`.
group_vars/ and host_vars/ beside the playbooks (site.yml, playbooks/), which Ansible also reads, are refused.
"""

from __future__ import annotations

from pathlib import Path

# what pdstack supports, and the defaults it pins where the configuration leaves them unset
INVENTORY_PLUGINS = ["yaml"]
VARS_PLUGINS = ["host_group_vars"]
VARS_EXTENSIONS = [".yml", ".yaml", ".json"]
INVENTORY_EXTS = (".yml", ".yaml", ".json")
VAR_DIRS = ("group_vars", "host_vars")
# Ansible's INVENTORY_IGNORE_EXTS default (config/base.yml: REJECT_EXTS + .orig, .cfg, .retry): files it never reads
IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".ini", ".cfg",
                ".retry")
# the configuration settings that decide what Ansible reads, and the value pdstack supports for each
PINNED = {
    "INVENTORY_ENABLED": ("[inventory] enable_plugins / ANSIBLE_INVENTORY_ENABLED", INVENTORY_PLUGINS),
    "VARIABLE_PLUGINS_ENABLED": ("[defaults] vars_plugins_enabled / ANSIBLE_VARS_ENABLED", VARS_PLUGINS),
    "YAML_FILENAME_EXTENSIONS": ("[defaults] yaml_valid_extensions / ANSIBLE_YAML_FILENAME_EXT", VARS_EXTENSIONS),
    "INVENTORY_IGNORE_PATTERNS": ("[inventory] ignore_patterns / ANSIBLE_INVENTORY_IGNORE_REGEX", []),
    # how Ansible merges what it read: the precedence load/origins.py reports shadowing by, and replace (a
    # higher level's mapping replaces a lower one's, never merges into it)
    "VARIABLE_PRECEDENCE": ("[defaults] precedence / ANSIBLE_PRECEDENCE",
                            ["all_inventory", "groups_inventory", "all_plugins_inventory", "all_plugins_play",
                             "groups_plugins_inventory", "groups_plugins_play"]),
    "DEFAULT_HASH_BEHAVIOUR": ("[defaults] hash_behaviour / ANSIBLE_HASH_BEHAVIOUR", "replace"),
}
# beside a playbook, Ansible reads group_vars/ and host_vars/ too (its `_plugins_play` level): site.yml and
# playbooks/*.yml must have none, so the inventory is the only place variables come from
PLAYBOOK_DIRS = (".", "playbooks")


def config_problems() -> list[str]:
    """Settings of the Ansible configuration in force (this process's environment and config file, as
    ansible-playbook started from here would read them) that make Ansible read other sources than pdstack checks.
    A setting left at Ansible's default is pinned to pdstack's instead (pin())."""
    from ansible import constants as C

    out = []
    for key, (name, wanted) in PINNED.items():
        value, origin = C.config.get_config_value_and_origin(key)
        if isinstance(wanted, str):
            if origin != "default" and value != wanted:
                out.append(f"{name} = {value} ({origin}): pdstack checks variables as Ansible merges them with "
                           f"{wanted}, so Ansible would use values pdstack never checked; unset it")
            continue
        if origin != "default" and list(value or []) != wanted:
            out.append(f"{name} = {', '.join(map(str, value or [])) or '(empty)'} ({origin}): pdstack reads "
                       f"inventories with {', '.join(wanted) or 'none'} only, so Ansible would read sources pdstack "
                       f"never checked; unset it (the repository's ansible.cfg sets what pdstack supports)")
    return out + playbook_vars_problems(Path(__file__).resolve().parents[3])


def playbook_vars_problems(root: Path) -> list[str]:
    """group_vars/ or host_vars/ beside the repository's playbooks: Ansible reads them for every host of a run."""
    if not (root / "site.yml").is_file():
        return []  # not run from the repository (an installed pdstack): no playbooks of ours to sit beside
    return [f"{d}/ (beside {'site.yml' if where == '.' else where + '/*.yml'}): Ansible reads it for every host of "
            "a playbook run, where pdstack never checks it; move its variables into the inventory and remove it"
            for where in PLAYBOOK_DIRS for d in (str(Path(where) / v) for v in VAR_DIRS)
            if (root / d).exists()]


def pin() -> None:
    """This process reads inventories with exactly the supported plugins (whatever Ansible's defaults would add)."""
    from ansible import constants as C

    C.INVENTORY_ENABLED = list(INVENTORY_PLUGINS)
    C.VARIABLE_PLUGINS_ENABLED = list(VARS_PLUGINS)


def tree_problems(src: Path) -> list[str]:
    """Entries of inventory directory `src` that are not a supported source: each named, with the fix."""
    if not src.is_dir():
        if src.suffix not in INVENTORY_EXTS:
            return [f"inventory {src}: pdstack reads a directory (hosts.yml, group_vars/, host_vars/) or one "
                    f"{'/'.join(INVENTORY_EXTS)} file; convert it to YAML (hosts.yml)"]
        return []
    out = []
    for p in sorted(src.iterdir()):
        name = p.name
        if name.startswith("."):
            continue  # Ansible skips hidden entries
        if p.is_symlink() and not p.exists():
            out.append(f"{name} (in {src}): a broken symbolic link; remove it")
            continue
        if p.is_dir():
            if name not in VAR_DIRS:
                out.append(f"{name}/ (in {src}): Ansible reads every directory of an inventory as more inventory "
                           "sources, which pdstack does not check; move it out of the inventory directory (facts: "
                           "pass --facts DIR)")
            continue
        if name.endswith(IGNORED_EXTS):
            continue  # Ansible ignores it (INVENTORY_IGNORE_EXTS)
        if p.suffix not in INVENTORY_EXTS:
            out.append(f"{name} (in {src}): Ansible would read it as an inventory source (an INI file, a script "
                       "or a file without an extension), which pdstack does not support or check; write hosts and "
                       "groups in hosts.yml and remove it (or give it an extension Ansible ignores, e.g. .md)")
    return out

