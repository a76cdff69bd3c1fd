"""What a CUDA graph is to the engine (sjdvp_core/engine/captured.py), on the CPU: the tensors of a
recorded function's arguments copied into static buffers (the ones it writes in place used where
they are), a warm-up run whose writes are reset, and each replay's outputs written into the same
static outputs, which the next replay overwrites, as a CUDA graph's are. CI has no GPU: this
drives the captured path's buffers, shape keys, checks and fallbacks."""

from __future__ import annotations

from sjdvp_core.engine.captured import fill, static


class StaticReplay:
    def __init__(self, fn, args, pool, held=frozenset(), reset=lambda: None):
        self.fn, self.args = fn, static(args, held)
        self.out = static(fn(*self.args), frozenset())  # the warm-up run a CUDA capture makes first
        reset()

    def __call__(self, *args):
        fill(self.args, args)
        fill(self.out, self.fn(*self.args))
        return self.out
