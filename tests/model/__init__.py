"""Tests of attention.model: the GPT, generation and checkpoints against the book and Hugging Face."""
