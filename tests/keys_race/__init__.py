"""The keys race: producer processes sending, cancelling and rescheduling a few shared keys
while worker processes drain the queue (tests/test_keys_race.py, tests/chaos/test_keys_race.py)."""
