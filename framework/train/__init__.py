"""One training process: the worker (build the strategy, train, tear down), the trainer's loop and the
pieces it calls (step batches, non-finite handling)."""
