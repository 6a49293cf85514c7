"""Root conftest: plugins for the whole suite (tests/ and kernels/tests/).

pdstack.testing.leaks fails the session when a process the tests started is still alive at its end;
pdstack.testing.timebudget prints the slow tests against tests/time_budget.json;
pdstack.testing.parallel puts the tests that share the pdstack-test-N hosts first, for the two xdist workers.
"""

pytest_plugins = ["pdstack.testing.leaks", "pdstack.testing.timebudget", "pdstack.testing.parallel"]
