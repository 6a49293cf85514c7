"""A pytest plugin: how the suite runs on pytest-xdist workers (`invoke test` passes `-n 3 --dist loadgroup`).

The test files that share fixed-name resources (the systemd test hosts pdstack-test-N, pdstack-three-N,
pdstack-roll-1, pdstack-pull-1, pdstack-model-1) are listed in pyproject.toml (`[tool.pytest.ini_options]
pdstack_shared_host_tests`), one line per group of files (a line may hold several files, whose hosts differ, to
balance the groups' lengths).
A group's tests are one unit of work: one worker runs them all, in file order, while other workers take other groups
and every other test one by one. They are the longest part of the suite, so they are also collected first, in the
order of the lines: xdist hands the first units to the first workers, and the groups start at once instead of after
half the suite. With fewer workers than groups, the groups past the last worker join the last worker's unit (xdist
hands each worker two units at the start, so a group of its own would wait behind the first unit: `-n 2` runs the
first group and the rest of them side by side). Without xdist (`-n 0`) the order is the same, the groups first.

Why not xdist's own `xdist_group` marker: pytest-xdist 3.8.0 marks a grouped test by assigning `item._nodeid`, which
pytest 9.2 no longer reads (a node's id is `item._id`), so with pytest 9.2 the marker groups nothing (seen here: the
two tests of one group ran on gw0 and gw1). This plugin uses xdist's public scheduler hook instead, with xdist's own
LoadScopeScheduling, and only decides which unit a test belongs to.
"""

from __future__ import annotations

import pytest

INI = "pdstack_shared_host_tests"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, "groups of test files (rootdir-relative, space-separated, one group per line) that share "
                  "fixed-name test hosts: each group one xdist unit, collected first", type="linelist", default=[])


def groups(config: pytest.Config) -> dict[str, int]:
    """{test file: its group's index} from the ini lines."""
    return {f: n for n, line in enumerate(config.getini(INI)) for f in line.split()}


def units(shared: dict[str, int], workers: int) -> dict[str, int]:
    """{test file: its unit of work} for `workers` workers: a group per unit, the groups past the last worker in the
    last worker's unit."""
    last = max(1, workers) - 1
    return {f: min(n, last) for f, n in shared.items()}


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items: list[pytest.Item]) -> None:
    shared = groups(config)
    if any(_file(i.nodeid) in shared for i in items):
        first = sorted((i for i in items if _file(i.nodeid) in shared), key=lambda i: shared[_file(i.nodeid)])
        items[:] = first + [i for i in items if _file(i.nodeid) not in shared]


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup`: each group of shared-host files is one unit (more groups than workers: see units()),
    every other test a unit of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared = groups(config)
    workers = config.getoption("numprocesses")  # an int by now (xdist resolves `auto`); None under --tx alone
    if isinstance(workers, int) and workers > 0:
        shared = units(shared, workers)

    class SharedHostsScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return f"shared-hosts-{shared[_file(nodeid)]}" if _file(nodeid) in shared else nodeid

    return SharedHostsScheduling(config, log)
