"""Janus-Pro and Janus (DeepSeek): the adapter over transformers' Janus classes, and the loader of
the original release."""

# Janus-4o's second guidance weight (ShareGPT-4o-Image's cfg_weight2), here so that the nodes read it
# without importing transformers
IMAGE_CFG = 5.0
