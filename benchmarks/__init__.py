"""Development tooling of the vaswani repository: benchmarks, the GPU report and the studies behind docs/benchmarks/.

Not part of the installed package. Run each tool from the root of a checkout, over the installed `vaswani` (with its
`test` extra: benchmarks/README.md), as `python -m benchmarks.NAME --help`.
"""
