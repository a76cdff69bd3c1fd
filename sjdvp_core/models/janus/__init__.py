"""Janus-Pro and Janus (DeepSeek): the adapter over transformers' Janus classes, and the loader of
the original release."""
