"""A queue over many shards (``SHARDS``): where a message lives (``placement``), the
``ShardedStore`` over one store per shard (``store``), and its parts: the layouts and their
register, fetching and its plan, the flow state's copies, wake-ups, reads and stats, and
the servers that hung.

It imports nothing here, so that the unsharded store can use ``placement`` without loading
the sharded one."""
