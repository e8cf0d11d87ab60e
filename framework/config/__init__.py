"""Configuration: schemas, the order in which rules run, and what the command line set."""
