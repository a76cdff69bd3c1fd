"""Lumina-mGPT 2.0 with Sber AI's MoVQGAN-270M: the adapter and the MoVQGAN."""
