"""`python -m sjdvp_core`: generate with several methods side by side (sjdvp_core.cli.generate)."""
from .cli.generate import main, parser

main(**vars(parser().parse_args()))
