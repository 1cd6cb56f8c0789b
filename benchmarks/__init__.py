"""The benchmark suite: ``make bench`` (or ``python -m benchmarks``) prints a Markdown table.

Every measurement runs against a private redis-server this suite starts on a free port
(the shards benchmark, a private Redis Cluster); workers are real ``manage.py
run_delayqueue`` processes. See ``python -m benchmarks --help``.
"""
