"""The transactional outbox and exactly-once handlers: outbox rows written in the sender's
transaction, the relay that moves them to Redis once committed, and the processed-id records
that make a handler's database effects happen once."""
