"""What a durafix worker tells an operator about itself: its ``/metrics`` (:mod:`.worker_metrics`, :mod:`.endpoint`)."""
