"""`stepscope precision`: the two classic mixed-precision experiments (`experiments`: `run_accumulate`,
`run_dtypes`, which write `precision` records), their settings (`config`, torch-free)."""
