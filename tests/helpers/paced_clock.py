"""A clock for the calibration tests: each iteration of the loop costs what the test says, so a
measured pass cost is a function of the test's numbers and never of how fast this machine ran."""

from __future__ import annotations

from sjdvp_core.engine.loop import JacobiDecoder


class PacedClock:
    """now() advances only when an iteration ends, by seconds(decoder) (`pace`)."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def pace(self, monkeypatch, seconds) -> None:
        """Every JacobiDecoder iteration from now on costs seconds(decoder) on this clock."""
        iterate = JacobiDecoder.iterate

        def paced(decoder, loop):
            iterate(decoder, loop)
            self.t += seconds(decoder)

        monkeypatch.setattr(JacobiDecoder, "iterate", paced)
