"""The benchmarks: each prints its figures and the device it ran on (``python -m bench.NAME``)."""
