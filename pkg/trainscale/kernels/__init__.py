"""Numba kernels: plain arrays and scalars in, arrays out; no Python objects and no I/O.

``layout`` names the slots of the arrays; ``compute`` and ``collectives`` hold one scalar
function per formula; ``plan`` prices a layer and a whole step; ``grid`` evaluates many plans.
"""
