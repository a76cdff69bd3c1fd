"""Lumina-mGPT 1.0 (Chameleon architecture) with Meta's Chameleon VQGAN: the adapter and the
VQGAN."""
