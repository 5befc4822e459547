"""Statistical efficiency: optimisers run to a target loss (:mod:`.convergence`, on the problems of
:mod:`.synthetic_problems`, each method's inputs drawn by :mod:`.method_setup`; the gradient noise scale in
:mod:`.noise_scale`), compressed gradients (:mod:`.compression`), and wall-clock time to target from the model's
step time (:mod:`.wallclock`). Imports the model, the kernels and the common helpers."""
