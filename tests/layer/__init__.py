"""Tests of attention.layer: the production layer against the explicit path, the float64 oracle and PyTorch."""
