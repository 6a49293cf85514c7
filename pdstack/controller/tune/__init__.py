"""The tuning driver (`pdstack tune`): candidates planned like inventories, applied by the rolling restart, gated by
recall, measured by SGLang's bench_serving; beside `pipeline.py`, it drives the stages and imports no later one."""
