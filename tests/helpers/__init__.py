"""Shared test helpers: tiny real-layout model folders (tiny_*), a fake Hugging Face Hub (fake_hub), reference
implementations to compare against (toy_reference, tree_check)."""
