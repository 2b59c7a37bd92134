"""quantbench's Hydra sweepers (found by Hydra's plugin scan of `hydra_plugins`)."""
