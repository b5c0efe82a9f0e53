"""GPU benchmarks of the kernels (triton.testing): see README.md in this folder."""
