"""Shared test helpers: tiny real-layout model folders (tiny_*; tiny_families runs one over every
family), a fake Hugging Face Hub (fake_hub), reference implementations to compare against
(toy_reference, tree_check, lumina_reference), the shipped workflows' files (comfy_workflows). What
more than one test module uses lives here: no test module imports another."""
