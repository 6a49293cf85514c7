"""Action plugin of the preflight role: what the run will read, read strictly before Ansible templates any of it.

It runs in the controller's ansible-playbook process, where Ansible keeps the raw command line
(ansible.context.CLIARGS) and the vault secrets it was given (the play's loader): the -e extra vars
(pdstack/controller/load/extra_vars.py), then the inventory as `pdstack plan` reads it (load/inventory.py
load_located: every file linted strictly, files encrypted whole decrypted with those secrets, the values read by
Ansible's own loading with these -e values, shadowing, the ssh address alias and every file Ansible read proven
linted). It changes nothing and never prints a value. Argument: inventory (the inventory directory this run
checks)."""

from __future__ import annotations

from ansible import context
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        from pdstack.controller.load import extra_vars, inventory
        from pdstack.errors import InventoryError

        result = super().run(tmp, task_vars)
        raw = tuple(context.CLIARGS.get("extra_vars") or ())
        problems, origins = extra_vars.check(list(raw))
        if not problems:
            from ansible.parsing.dataloader import DataLoader

            loader = DataLoader()  # the run's vault secrets, and nothing of the play's loader's state
            loader.set_vault_secrets(self._loader._vault.secrets)
            try:
                inventory.load_located(self._task.args["inventory"], raw, loader)
            except InventoryError as e:
                problems += e.problems
        result.update(changed=False, origins=origins)
        if problems:
            result.update(failed=True, msg="\n".join(f"- {p}" for p in problems))
        return result
