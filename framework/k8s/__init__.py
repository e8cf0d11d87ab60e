"""Kubernetes manifests that run a job of this framework (`python -m framework.k8s`)."""
