"""LlamaGen (Sun et al. 2024): its GPT, its VQ tokenizer, the FLAN-T5 caption encoder of its
text-to-image models, and the adapter."""
