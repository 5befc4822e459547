"""Shared helpers every layer may use: the input error (:mod:`.errors`), argument checks (:mod:`.checks`), the
strict YAML/CSV loader (:mod:`.inputs`), atomic writes and provenance (:mod:`.io`), progress bars, the plotting
style and figure checks, paper-vs-ours records (:mod:`.comparison`), publishing executed notebooks, and compiling
a kernel in a second process (:mod:`.jitaside`). Imports nothing from trainscale but :mod:`trainscale.kernels`'
cache folder."""
