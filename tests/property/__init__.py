"""Property-based tests: one per lifecycle invariant (Q1-Q16, C1-C10, L1-L5, R1-R4, P1-P2)."""
