"""The worker host: the pollers of the task queues, their supervisor, what a host can serve."""
