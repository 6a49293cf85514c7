"""Code that runs ON THE CONTROLLER (the machine that runs invoke and ansible-playbook), in the project venv.

inventory + schema (the inventory model), preflight + planner (checks and the plan), flags (SGLang's and
sglang-router's own parsers), smoke + recall + probe-driving bench (the deploy gates), monitoring (scrape config,
dashboards, query checks), locks (machine-wide locks for builds and test-host bases).
"""
