"""`python -m framework.torchrun [torchrun's options] -m framework [overrides]`: torchrun, with the exit status
a batch script requeues on.

Under plain torchrun a preemption signal was lost on the way out: on SIGTERM its agent passes the signal on,
the workers save a checkpoint and exit 143 (exit_codes.REQUEUE), and then torchrun exits 1 with a
SignalException traceback; SIGUSR1/SIGUSR2 (`sbatch --signal`) killed torchrun outright. A script testing
for 143 never requeued. Here torchrun runs in this process with the preemption signals handled as our own
launcher handles them (framework.runtime.preemption.stopping_once_on: the first goes on to the workers, repeats are
ignored), and exits 143 when its workers stopped with their checkpoint saved, which each worker says in a
file this wrapper names (preemption.REQUEUE_REPORT).
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile

from framework import exit_codes
from framework.config.schema import LauncherConfig
from framework.runtime.preemption import REQUEUE_REPORT, stopping_once_on


def _agent_signals(handled: str, preempt: list[str]) -> str:
    return ",".join(s for s in handled.split(",") if s not in preempt)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    preempt = LauncherConfig().preempt_signals
    if hasattr(args, "signals_to_handle"):
        args.signals_to_handle = _agent_signals(args.signals_to_handle, preempt)
    else:       # an older torch reads them from its environment
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = _agent_signals(
            os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"), preempt)
    with tempfile.TemporaryDirectory(prefix="framework-torchrun-") as tmp:
        report = os.environ[REQUEUE_REPORT] = os.path.join(tmp, "requeue")
        try:
            with stopping_once_on(preempt):
                run(args)
        except SignalException as e:
            return _stopped(report, f"stopped by {signal.Signals(e.sigval).name}", 128 + int(e.sigval))
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            if failure.exitcode == exit_codes.REQUEUE:      # the signal reached the workers only
                return _stopped(report, "the workers were stopped by a preemption signal", 1)
            print(e.format_msg(), file=sys.stderr)
            return 1
    return 0


def _stopped(report: str, how: str, otherwise: int) -> int:
    if os.path.exists(report):
        print(f"{how} after a checkpoint; exit {exit_codes.REQUEUE} asks to be requeued "
              f"(checkpoint.resume=auto continues)", file=sys.stderr)
        return exit_codes.REQUEUE
    print(f"error: {how} without a checkpoint of the last step; see the workers' output above", file=sys.stderr)
    return otherwise


if __name__ == "__main__":
    sys.exit(main())
