"""The benchmarks, the GPU report and the studies behind docs/benchmarks/, run from a checkout: benchmarks/README.md."""
