"""TEST INFRASTRUCTURE, never part of a production deployment: the sim test engine (sim/, the only part that goes into
the sim image), the local systemd test hosts, and the suite's leak detector (leaks.py, a pytest plugin).
"""
