"""The performance model: specs and catalogs (:mod:`.specs`, :mod:`.catalog`), one plan's step time, memory and
energy (:mod:`.perfmodel`), the pipeline simulator (:mod:`.pipeline`), grids and the planner's search
(:mod:`.searchspace`, :mod:`.scaling`, :mod:`.plancluster`), stack rules (:mod:`.stackrules`), calibration and
validation against measured runs, and the models built on them (inference, overlap, heterogeneous clusters,
sweeps). Imports :mod:`trainscale.kernels` and :mod:`trainscale.common` only."""
