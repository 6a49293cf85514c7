"""Root conftest: plugins for the whole suite (tests/ and kernels/tests/).

pdstack.testing.leaks fails the session when a process the tests started is still alive at its end.
"""

pytest_plugins = ["pdstack.testing.leaks"]
