"""What the stats command, the admin pages and the Prometheus metrics report of a queue."""
