"""A pytest plugin: how the suite runs on two pytest-xdist workers (`invoke test` passes `-n 2 --dist loadgroup`).

The test files that share fixed-name resources, the systemd test hosts named pdstack-test-N, are listed in
pyproject.toml (`[tool.pytest.ini_options] pdstack_shared_host_tests`: tests/test_site.py, tests/test_image_pull.py).
Their tests are one unit of work: one worker runs them all, in file order, while the other worker takes every other
test one by one. They are the longest part of the suite, so they are also collected first: xdist hands the first
unit to the first worker, and the group starts at once instead of after half the suite. Without xdist (`-n 0`) the
order is the same, the group first.

Why not xdist's own `xdist_group` marker: pytest-xdist 3.8.0 marks a grouped test by assigning `item._nodeid`, which
pytest 9.2 no longer reads (a node's id is `item._id`), so with pytest 9.2 the marker groups nothing (seen here: the
two tests of one group ran on gw0 and gw1). This plugin uses xdist's public scheduler hook instead, with xdist's own
LoadScopeScheduling, and only decides which unit a test belongs to.
"""

from __future__ import annotations

import pytest

GROUP = "pdstack-test-hosts"
INI = "pdstack_shared_host_tests"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, "test files (rootdir-relative) that share the pdstack-test-N hosts: one xdist unit, run first",
                  type="linelist", default=[])


def _shared(config: pytest.Config) -> set[str]:
    return set(config.getini(INI))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items: list[pytest.Item]) -> None:
    shared = _shared(config)
    first = [i for i in items if i.nodeid.split("::", 1)[0] in shared]
    if first:
        rest = [i for i in items if i.nodeid.split("::", 1)[0] not in shared]
        items[:] = first + rest


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup`: the shared-host files are one unit, every other test a unit of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared = _shared(config)

    class SharedHostsScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return GROUP if nodeid.split("::", 1)[0] in shared else nodeid

    return SharedHostsScheduling(config, log)
