"""Tests of attention.lab: the chapters' experiments."""
