"""Errors shared by every pdstack module.

Each carries a message that names what is wrong and how to fix it; the CLI prints it and exits non-zero.
"""


class PdstackError(Exception):
    """Base of every error pdstack reports to a user."""

    exit_code = 1


class InventoryError(PdstackError):
    """The inventory (group_vars/host_vars) is invalid. Raised before any host is touched."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))


class FactsError(PdstackError):
    """Host facts are missing or malformed."""

    exit_code = 3
