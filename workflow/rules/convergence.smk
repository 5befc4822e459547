# The convergence studies (section B of STUDIES.md and the batch-size study): each runs the
# distributed optimisers on a synthetic problem and prices their steps with the performance model.
# Same pattern as rules/studies.smk: papermill runs notebooks/<study>.ipynb with the study's
# parameters for the current mode; the executed notebook is the log.


rule geo_distributed:
    input:
        notebook=study_notebook("geo-distributed"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "geo-distributed",
            [
                "geo_pipeline.nc",
                "compression_convergence.nc",
                "throughput.png",
                "speedup.png",
                "convergence.png",
            ],
        ),
    log:
        executed_notebook("geo-distributed"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("geo-distributed"),
    shell:
        PAPERMILL


rule gradient_compression:
    input:
        notebook=study_notebook("gradient-compression"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "gradient-compression",
            [
                "ist_vs_compression.nc",
                "suboptimality_vs_steps.png",
                "suboptimality_vs_bits.png",
                "floor_vs_heterogeneity.png",
            ],
        ),
    log:
        executed_notebook("gradient-compression"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("gradient-compression"),
    shell:
        PAPERMILL


rule hierarchical_local_sgd:
    input:
        notebook=study_notebook("hierarchical-local-sgd"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "hierarchical-local-sgd",
            [
                "comparison.nc",
                "bandwidth.nc",
                "loss_vs_time.png",
                "time_to_target.png",
                "speedup_vs_bandwidth.png",
            ],
        ),
    log:
        executed_notebook("hierarchical-local-sgd"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("hierarchical-local-sgd"),
    shell:
        PAPERMILL


rule low_communication:
    input:
        notebook=study_notebook("low-communication"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "low-communication",
            [
                "low_communication.nc",
                "tokens_per_s.png",
                "loss_vs_tokens.png",
                "loss_vs_time.png",
            ],
        ),
    log:
        executed_notebook("low-communication"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("low-communication"),
    shell:
        PAPERMILL


rule batch_size:
    input:
        notebook=study_notebook("batch-size"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "batch-size",
            [
                "batch_size.nc",
                "steps_to_target.png",
                "time_to_target.png",
                "cost_vs_time.png",
            ],
        ),
    log:
        executed_notebook("batch-size"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("batch-size"),
    shell:
        PAPERMILL
