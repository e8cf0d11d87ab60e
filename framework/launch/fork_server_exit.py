"""Imported only by the workers' fork server (launch.torch.start_fork_server preloads it). The server exits when
the launcher does; Python's teardown of a process holding torch then takes ~1 s, during which the server
still holds the job's stdout and stderr open, so whoever reads them (a pipe, a test, a CI log) waits.
It writes nothing, so it can leave without the teardown. Workers fork from it but end through
multiprocessing's os._exit, which runs no atexit handler."""
import atexit
import os

atexit.register(os._exit, 0)
