"""The domain models behind single studies (curtailment, swarm training, MPC, pruning, chiplets, GEAR, job
profiles, kernel machines, meta-learned recommenders). Built on the model and training layers; imported by the
studies."""
