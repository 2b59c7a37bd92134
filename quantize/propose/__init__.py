"""`python -m quantize.propose`: a mixed-precision recipe from a per-layer
sensitivity file. The most sensitive module groups of the decoder layers stay
dense (added to the base recipe's `ignore` lists); how many is chosen for a
size target, a KL target, or given directly."""
