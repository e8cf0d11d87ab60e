"""The engines that run a job's workers (framework.cluster.engines names them)."""
