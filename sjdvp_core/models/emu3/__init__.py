"""Emu3 (BAAI): the adapter over transformers' Emu3 classes, and the loader of the original
release."""
