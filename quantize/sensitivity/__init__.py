"""Per-layer sensitivity: `python -m quantize.sensitivity recipe=<name>`.

Each Linear module of each decoder layer (a cell) is quantized alone with the
recipe's weight scheme, and the model is scored against the original by
KL divergence on held-out text. The file (quantize.common.sensitivity_file)
ranks the cells for the proposer and the search, and the heat map
(quantize.common.sensitivity_plot) shows them."""
