"""Composing a job's config with Hydra: the schemas registered in its ConfigStore (config_store.py). Above the
strategies (each strategy's options are its parallel.* schema) and below everything that composes a config: the
launch, the plan and k8s commands, the reference."""
