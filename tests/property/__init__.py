"""Property-based tests: one per lifecycle invariant (Q1-Q14, C1-C6, L1-L4, R1-R4, P1-P2)."""
