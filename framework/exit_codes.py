"""Exit codes a launcher acts on (a leaf: imports nothing of ours).

0 done; USAGE: a configuration or usage error found before work; REQUEUE: the run stopped on a
preemption signal after saving a checkpoint, so run it again with checkpoint.resume=auto; STALL: a rank's
stall watchdog fired (no step finished within trainer.stall_timeout_s; stacks in <run dir>/stall/);
GPU_FAULT: a rank's GPU reported uncorrectable ECC errors it did not have when the job started (the message
names host and GPU): restart the job without that node.
REQUEUE is 128 + SIGTERM: what a shell reports for a job ended by SIGTERM, and inside the 128-255
range that Kubeflow's `restartPolicy: ExitCode` retries (1-127 count as permanent failures: so are STALL
and GPU_FAULT, which a restart on the same node would only repeat).
"""
import signal

USAGE = 2
REQUEUE = 128 + signal.SIGTERM
STALL = 75
GPU_FAULT = 76
