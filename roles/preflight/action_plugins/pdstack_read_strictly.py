"""Action plugin of the preflight role: what the run will read, read strictly before Ansible templates any of it.

It runs in the controller's ansible-playbook process, where Ansible keeps the raw command line
(ansible.context.CLIARGS) and the vault secrets it was given (the play's loader): the -e extra vars
(pdstack/controller/load/extra_vars.py) and every file of the inventory (load/inventory.py check_files, files
encrypted whole with ansible-vault decrypted with those secrets). It changes nothing and never prints a value.
Argument: inventory (the inventory directory this run checks)."""

from __future__ import annotations

from ansible import context
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        from pdstack.controller.load import extra_vars, inventory, vault
        from pdstack.errors import InventoryError

        result = super().run(tmp, task_vars)
        problems, origins = extra_vars.check(list(context.CLIARGS.get("extra_vars") or ()))
        try:
            inventory.check_files(self._task.args["inventory"], decrypt=vault.decrypter(self._loader))
        except InventoryError as e:
            problems += e.problems
        result.update(changed=False, origins=origins)
        if problems:
            result.update(failed=True, msg="\n".join(f"- {p}" for p in problems))
        return result
