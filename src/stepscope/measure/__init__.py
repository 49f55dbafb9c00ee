"""Measurement (torch). At the top, the harness every benchmark shares: `timer` (one N-way interleaved harness),
`stats`, `device`, `training` (the one training step), `gemm` (the CPU yardstick), `peaks`, `allocations` (the
allocation tracker), `categories` (what kind of work an op or kernel is), `ranges` (phase ranges), `environment`,
`outputs`. One subpackage per benchmark built on it, each with a torch-free `config` and a `benchmark` that writes
the records: `step`, `profile`, `memory`, `attention`, `precision`.

May import: errors, host, spec, results, nn (and the kernels through the attention registry).
"""
