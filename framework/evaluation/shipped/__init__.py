"""The offline tasks shipped with the package (lm-eval YAMLs, their rows, the loader and the rows' generator)."""
