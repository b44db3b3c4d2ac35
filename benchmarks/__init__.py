"""Speed and memory measurements: `python -m benchmarks.<name> --help`."""
