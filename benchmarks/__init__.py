"""The tools behind docs/benchmarks/: the benchmarks, the GPU report, the studies (benchmarks/README.md)."""
