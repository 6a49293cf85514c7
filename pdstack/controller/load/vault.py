"""Ansible Vault for pdstack's own reading: the secrets Ansible's configuration names, and whole encrypted files.

ansible-playbook takes the vault password from --vault-password-file/--vault-id/--ask-vault-pass on its command
line, or from its configuration (ANSIBLE_VAULT_PASSWORD_FILE, ANSIBLE_VAULT_IDENTITY_LIST, or vault_password_file
and vault_identity_list in ansible.cfg). Inside a playbook run, the preflight role's action plugin hands pdstack the
playbook's own loader (its secrets, whatever way they were given); a `pdstack` command run by hand takes them from
the configuration, as `ansible-inventory` would (Ansible's CLI.setup_vault_secrets, without prompting).
"""

from __future__ import annotations

from collections.abc import Callable

VAULT_HEADER = "$ANSIBLE_VAULT;"
Decrypt = Callable[[str], str]


def loader():
    """Ansible's DataLoader with the vault secrets Ansible's configuration names (none when it names none)."""
    from ansible import constants as C
    from ansible.cli import CLI
    from ansible.parsing.dataloader import DataLoader

    dl = DataLoader()
    files = [C.DEFAULT_VAULT_PASSWORD_FILE] if C.DEFAULT_VAULT_PASSWORD_FILE else []
    ids = list(C.DEFAULT_VAULT_IDENTITY_LIST or [])
    if files or ids:
        secrets = CLI.setup_vault_secrets(dl, vault_ids=ids, vault_password_files=files, ask_vault_pass=False,
                                          auto_prompt=False, initialize_context=False)
        dl.set_vault_secrets(secrets)
        _context(secrets)
    return dl


def _context(secrets) -> None:
    """Inline !vault values decrypt through Ansible's process-wide VaultSecretsContext (initialised once, as
    ansible-playbook does; a second call in one process keeps the first)."""
    from ansible.parsing.vault import VaultSecretsContext

    try:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    except Exception:  # noqa: BLE001 - already initialised in this process (ansible-playbook, or an earlier load)
        pass


def decrypter(dl) -> Decrypt:
    """decrypt(text) -> plaintext with `dl`'s secrets; raises ValueError naming the fix when it cannot."""
    from ansible.errors import AnsibleError

    def decrypt(text: str) -> str:
        try:
            return dl._vault.decrypt(text).decode("utf-8")
        except AnsibleError as e:
            raise ValueError(f"ansible-vault could not decrypt it ({str(e).splitlines()[0]}): give Ansible the vault "
                             "password its usual way (--vault-password-file or --vault-id to ansible-playbook; "
                             "ANSIBLE_VAULT_PASSWORD_FILE for a pdstack command)") from None
        except UnicodeDecodeError:
            raise ValueError("its plaintext is not UTF-8 text") from None

    return decrypt
