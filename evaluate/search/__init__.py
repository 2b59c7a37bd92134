"""The multi-objective recipe search (python -m evaluate.search): trials are
quantize -> evaluate jobs proposed by Optuna through Hydra's sweeper."""
