"""TEST INFRASTRUCTURE, never part of a production deployment: the sim test engine (sim/, the only part that goes into
the sim image) and the local systemd test hosts.
"""
