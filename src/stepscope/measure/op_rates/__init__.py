"""`stepscope op-rates`: the rates of a model's own matrix ops on this GPU, next to what the performance model
assumes for them. The ops and their shapes (`shapes`, torch-free), the settings (`config`, torch-free) and the
timed run that writes the `op-rates` records (`benchmark`); `stepscope calibrate --rates` fits a system to them
(`perfmodel/calibrate/rates.py`)."""
