"""Seeded defects and the proof that every gate can go red.

`catalogue` names each planted defect, the real failure it models and the gates it must turn
red; `apply` copies the tree to a temporary folder and plants a defect there; `prover` runs the
gates on one planted copy; `matrix` turns gate results into a `Proof`: the defects x gates
matrix and its verdict; `prove` runs it all (`specgate prove`, `python -m mutants.proof.prove`). The
working tree is never modified. `mutate` and its `mutation_*` modules are the mutmut runs.

This folder is not mutmut's working folder: no mutmut file belongs here.
"""
