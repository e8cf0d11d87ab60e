"""Exit codes a launcher acts on (a leaf: imports nothing of ours).

0 done; USAGE: a configuration or usage error found before work; REQUEUE: the run stopped on a
preemption signal after saving a checkpoint, so run it again with checkpoint.resume=auto.
REQUEUE is 128 + SIGTERM: what a shell reports for a job ended by SIGTERM, and inside the 128-255
range that Kubeflow's `restartPolicy: ExitCode` retries (1-127 count as permanent failures).
"""
import signal

USAGE = 2
REQUEUE = 128 + signal.SIGTERM
