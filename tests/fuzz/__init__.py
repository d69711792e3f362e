"""Differential fuzzer: random op programs run on cpu and on tpu (every eager mode and
torch.compile), comparing values, dtypes, shapes and raised exception types.
`python -m tests.fuzz.run --help` (docs/design.md, "Tests and coverage")."""
