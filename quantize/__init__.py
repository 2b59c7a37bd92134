"""quantbench quantize stage: model + recipe + calibration text -> artifact."""
