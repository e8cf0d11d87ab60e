"""The optimizers' fixed choices that the schema offers, here and not in the modules that use them: the launcher
imports the schema, and framework/optim/muon.py imports torch's DTensor (about a second)."""

MUON_MODES = ("gather", "round_robin")     # how Muon orthogonalises a sharded matrix (framework/optim/muon.py)
ALGORITHMS = ("muon", "adamw")             # the updates optimizer=muon gives its parameter groups
