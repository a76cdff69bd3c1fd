"""Command lines (`python -m sjdvp_core`, `.check`, `.download` are entry points onto these
packages)."""
