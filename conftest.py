"""Root conftest: plugins for the whole suite (tests/ and kernels/tests/).

pdstack.testing.leaks fails the session when a process the tests started is still alive at its end;
pdstack.testing.timebudget prints the slow tests against tests/time_budget.json;
pdstack.testing.parallel puts each unit of tests that share fixed-name test hosts (pyproject.toml's
pdstack_shared_host_tests) first, so that one xdist worker runs each unit (`invoke test` starts three).
"""

pytest_plugins = ["pdstack.testing.leaks", "pdstack.testing.timebudget", "pdstack.testing.parallel"]
