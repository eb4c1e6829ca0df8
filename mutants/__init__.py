"""Seeded defects and the proof that every gate can go red.

`catalogue` names each planted defect, the real failure it models and the gates it must turn
red; `apply` copies the tree to a temporary folder and plants a defect there; `matrix` turns
gate results into the defects x gates matrix and its verdict; `prove` runs it all
(`specgate prove`, `python -m mutants.prove`). The working tree is never modified.

This folder is not mutmut's working folder: no mutmut file belongs here.
"""
