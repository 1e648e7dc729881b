"""The math of every op, one module per family; builders are found by name (see registry).

Modules starting with ``_`` hold shared helpers (special functions), not ops.
"""
