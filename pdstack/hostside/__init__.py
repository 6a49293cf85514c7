"""Code that runs ON A HOST with the host's own python3: the standard library only, nothing from the venv.

The whole folder ships as one file, the host-side artifact pdstack-hostside.pyz (pdstack/controller/render/hostside.py
builds it, roles/hostside installs it), and every role and unit runs one of its commands (__main__.py): the facts.d
script, the rolling restart's drain steps and probe, the watchdog timer, the watchdog key's forced command, the model
fetcher, `pdstack status`'s collector. The modules import only the standard library and each other (plus
pdstack/__init__.py); tests/test_hostside.py imports each under `python3 -I -S` and runs each command of the built
artifact under `python3 -I`.
"""
