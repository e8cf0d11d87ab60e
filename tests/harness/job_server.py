"""`python -m framework ...` for the tests, forked from one process that imported torch and the framework once.

Each job the suite runs started a fresh interpreter that imported torch, Hydra and the launcher (~2 s of CPU),
and, for a job with workers, a fork server that imported the workers' modules again (~2 s more): on two
cores, minutes of a CI run that trained nothing. This server imports them once; each job is a fork of it
that becomes what `python -m MODULE ARGS` would have been: its own session (a process group the test can
kill), its working directory and environment, its stdout and stderr in files, sys.argv, and `__main__`
run by runpy. Its workers' fork server is forked from the job in turn (multiprocessing spawns a fresh
interpreter for it), so it too starts with everything imported, in the job's session, with the job's
environment. Nothing runs in the server itself: every job starts from the same clean state.

Two shortcuts make the suite's hundreds of jobs cheaper, and only here (the framework itself takes neither): what
the server imported leaves the garbage collector's sight (gc.freeze), and a served launch names its rendezvous's
events from frames instead of torch's inspect.stack() (name_rendezvous_events_cheaply).

Protocol (a Unix socket, one connection a job, JSON lines): the client sends
{"argv": [...], "module": ..., "cwd": ..., "env": {...}, "stdout": path, "stderr": path}; the server
answers {"pid": N} once the job runs, then {"returncode": N} when it ends.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

#: what every job imports before it trains (the launcher, Hydra, torch); the workers' modules come from the
#: launcher and the strategy registry (preload below). framework.launch.fork_server_exit is left out on purpose:
#: it makes its importer exit 0 at exit
LAUNCHER = ("framework.__main__", "framework.launch.admission", "framework.launch.torch")
FORKSERVER_MAIN = "from multiprocessing.forkserver import main"


def _method_name(depth: int = 2) -> str:
    """What torch's dynamic_rendezvous.get_method_name returns, the name of the function `depth` frames above
    this one, read from the frame itself: torch's inspect.stack() builds every frame's source context and looks
    each frame's module up among all of sys.modules (~0.4 s of CPU a launch with torch, transformers and DeepSpeed
    loaded, every served job that spawns workers)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:                  # a stack shallower than depth
        return "no_method_name"


def name_rendezvous_events_cheaply() -> None:
    """Served jobs name the rendezvous's events with _method_name (a test-only shortcut: tests/
    test_rendezvous_events.py holds it to torch's own names, and fails where torch no longer has the function)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    if hasattr(dynamic_rendezvous, "get_method_name"):
        dynamic_rendezvous.get_method_name = _method_name


def _fork_instead_of_spawn() -> None:
    """multiprocessing starts the fork server as a new interpreter (spawnv_passfds); fork it from the job
    instead, as that interpreter would have run it: only stdio and the fds it was passed left open, default
    signal handlers where the job set its own (ignored signals stay ignored, as across exec)."""
    from multiprocessing import util
    spawn = util.spawnv_passfds

    def spawnv_passfds(path, args, passfds):
        cmd = args[args.index("-c") + 1] if "-c" in args else ""
        if not cmd.startswith(FORKSERVER_MAIN):
            return spawn(path, args, passfds)
        pid = os.fork()
        if pid:
            return pid
        try:
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd > 2 and fd not in passfds:
                    try:
                        os.close(fd)
                    except OSError:         # the listing's own fd, closed already
                        pass
            for sig in signal.valid_signals():
                if callable(signal.getsignal(sig)):
                    signal.signal(sig, signal.SIG_DFL)
            exec(cmd, {"__name__": "__mp_forkserver__"})
        except SystemExit:
            pass
        finally:
            os._exit(0)

    util.spawnv_passfds = spawnv_passfds


def _run_job(request: dict) -> None:
    """In the forked child: become the job, run it, exit with its code (never returns)."""
    code = 1
    try:
        os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _fork_instead_of_spawn()
        import runpy
        import threading
        import warnings
        # the module ran as __main__ is a fresh copy, as `python -m` runs it, beside the one the server imported
        warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package", RuntimeWarning)
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve_one(conn: socket.socket) -> None:
    """In a forked nanny: start the job, report its pid, wait for it, report its exit code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with conn, conn.makefile("rwb") as stream:
        request = json.loads(stream.readline())
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run_job(request)
        stream.write(json.dumps({"pid": pid}).encode() + b"\n")
        stream.flush()
        _, status = os.waitpid(pid, 0)
        stream.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        stream.flush()


def preload() -> tuple[str, ...]:
    from framework.launch.preload import FORK_SERVER_PRELOAD
    from framework.strategies.registry import all_strategy_classes
    workers = {m for cls in all_strategy_classes().values() for m in cls.worker_modules}
    return (*LAUNCHER, *FORK_SERVER_PRELOAD, *sorted(workers))


def serve(address: str) -> None:
    import gc
    import importlib
    for module in preload():
        importlib.import_module(module)
    name_rendezvous_events_cheaply()
    # What the server imported leaves the garbage collector's sight (it lives as long as any job): a job, its
    # workers' fork server and their workers, all forked from here, collect only what they made (a collection
    # that scanned it all took ~0.2-0.4 s of CPU a job at its teardown: hundreds of jobs a session).
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # nannies are reaped by the kernel
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address + ".tmp")
        os.rename(address + ".tmp", address)               # the client waits for the name: it is ready now
        listener.listen(16)
        while True:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                try:
                    _serve_one(conn)
                finally:
                    os._exit(0)
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
