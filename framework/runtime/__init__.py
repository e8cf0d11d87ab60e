"""What a process runs on and in: its devices and ranks, the cluster's environment, the engines that run
workers, determinism, memory, preemption, elastic restarts, the stall watchdog and injected faults."""
