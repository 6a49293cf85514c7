"""The operator's status view (`pdstack status`): what the hosts report, judged against the plan and shown; beside
`pipeline.py` and tune/, a driver that gates nothing, reads the inventory and the hosts, and no stage imports it."""
