"""What a job trains toward: an Objective scores a micro-batch's model output against its targets. The trainer
and the strategies see only the Objective (registry.py names them; lm.py is next-token cross-entropy)."""
