"""Code that runs ON A HOST with the host's own python3: the standard library only, nothing from the venv.

facts.py is installed as the Ansible local facts script (roles/facts); probe.py + watchdog.py run the watchdog timer on
the router host (roles/watchdog). They import only the standard library and each other (plus pdstack/__init__.py);
tests/test_hostside.py imports each under `python3 -I` with nothing but the standard library to keep it that way.
"""
