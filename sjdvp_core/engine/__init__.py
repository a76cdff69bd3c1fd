"""The decoding engine: settings, the adapter interface, targets, the Jacobi window, drafting
(plain, VP, coupled), verification (SJD, LANTERN, GSD), draft trees, the loop and its statistics.
Pure torch."""
