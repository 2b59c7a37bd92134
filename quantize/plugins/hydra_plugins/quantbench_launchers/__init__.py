"""quantbench's Hydra launchers (found by Hydra's plugin scan of `hydra_plugins`)."""
