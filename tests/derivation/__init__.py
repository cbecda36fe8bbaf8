"""Tests of attention.derivation: the book's stages reproduce the book's and the seeds' numbers."""
