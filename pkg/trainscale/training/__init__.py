"""Statistical efficiency: optimisers run to a target loss (:mod:`.convergence`), compressed gradients
(:mod:`.compression`), and wall-clock time to target from the model's step time (:mod:`.wallclock`). Imports the
model, the kernels and the common helpers."""
