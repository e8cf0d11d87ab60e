"""Admission (admission.py: a job's config resolved, checked and written) and the engines that run its
workers (torch.py, ray.py: framework.runtime.engines names them), with the fork server's preload lists."""
