"""Model adapters, one module per family."""
