# One rule per scaling study: papermill runs notebooks/<study>.ipynb with the study's parameters
# for the current mode; the executed notebook is the log, the datasets and figures the outputs.
# To add a study: a block in config/config.yaml (+ config/schema.yaml), notebooks/<study>.ipynb,
# and a rule here copied from the ones below.

PAPERMILL = (
    'NUMBA_NUM_THREADS={threads} NUMBA_CACHE_DIR="${{NUMBA_CACHE_DIR:-$PWD/.numba_cache}}" '
    "MPLBACKEND=Agg JUPYTER_PREFER_ENV_PATH=1 "
    'papermill --kernel python3 --cwd "$PWD" --no-progress-bar '
    "{input.notebook:q} {log:q} -y {params.notebook:q}"
)


rule validation:
    input:
        notebook=study_notebook("validation"),
        package=PACKAGE_FILES,
        vtrain=vtrain_files,
    output:
        study_outputs("validation", ["validation.nc", "parity.png", "error_by_run.png"]),
    log:
        executed_notebook("validation"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("validation"),
    shell:
        PAPERMILL


rule hardware_scaling:
    input:
        notebook=study_notebook("hardware-scaling"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "hardware-scaling",
            [
                "hardware_scaling.nc",
                "throughput_per_gpu.png",
                "mfu.png",
                "total_throughput.png",
                "energy_per_token.png",
                "power_per_gpu.png",
                "allreduce_busbw.nc",
                "allreduce_busbw.png",
            ],
        ),
    log:
        executed_notebook("hardware-scaling"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=4000,
        runtime=study_runtime_min(quick=15, full=120),
    params:
        notebook=notebook_parameters("hardware-scaling"),
    shell:
        PAPERMILL


rule pipeline_planning:
    input:
        notebook=study_notebook("pipeline-planning"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "pipeline-planning",
            [
                "schedules.nc",
                "timelines.nc",
                "planner.nc",
                "gantt.png",
                "memory_vs_throughput.png",
                "planner.png",
            ],
        ),
    log:
        executed_notebook("pipeline-planning"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=20),
    params:
        notebook=notebook_parameters("pipeline-planning"),
    shell:
        PAPERMILL


rule heterogeneous_cluster:
    input:
        notebook=study_notebook("heterogeneous-cluster"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "heterogeneous-cluster",
            [
                "mix.nc",
                "fraction_of_sum.png",
                "throughput.png",
                "layers_on_first.png",
            ],
        ),
    log:
        executed_notebook("heterogeneous-cluster"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("heterogeneous-cluster"),
    shell:
        PAPERMILL


rule parallelism_strategies:
    input:
        notebook=study_notebook("parallelism-strategies"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "parallelism-strategies",
            [
                "strategies.nc",
                "tp_pp_sweep.nc",
                "published.nc",
                "tflops_vs_gpus.png",
                "tp_pp_heatmap.png",
            ],
        ),
    log:
        executed_notebook("parallelism-strategies"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("parallelism-strategies"),
    shell:
        PAPERMILL


rule overlap:
    input:
        notebook=study_notebook("overlap"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "overlap",
            [
                "overlap.nc",
                "message_size.nc",
                "step_time.png",
                "compute_slowdown.png",
                "power_cap.png",
                "message_size.png",
            ],
        ),
    log:
        executed_notebook("overlap"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("overlap"),
    shell:
        PAPERMILL


rule job_profile:
    input:
        notebook=study_notebook("job-profile"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "job-profile",
            [
                "decomposition.nc",
                "decomposition.png",
                "overheads.nc",
                "overheads.png",
                "finetuning.nc",
                "finetuning.png",
            ],
        ),
    log:
        executed_notebook("job-profile"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("job-profile"),
    shell:
        PAPERMILL


rule inference_overlap:
    input:
        notebook=study_notebook("inference-overlap"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "inference-overlap",
            [
                "inference_overlap.nc",
                "savings.png",
                "split_ratio.png",
                "bandwidth.png",
                "comm_share.png",
            ],
        ),
    log:
        executed_notebook("inference-overlap"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("inference-overlap"),
    shell:
        PAPERMILL


rule chiplet_scaling:
    input:
        notebook=study_notebook("chiplet-scaling"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "chiplet-scaling",
            [
                "chiplet_scaling.nc",
                "compute_comm_ratio.png",
                "step_breakdown.png",
                "throughput.png",
                "energy.png",
                "gain.png",
            ],
        ),
    log:
        executed_notebook("chiplet-scaling"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("chiplet-scaling"),
    shell:
        PAPERMILL


rule datacenter_design:
    input:
        notebook=study_notebook("datacenter-design"),
        package=PACKAGE_FILES,
    output:
        study_outputs(
            "datacenter-design",
            [
                "datacenter_design.nc",
                "mfu_vs_domain.png",
                "mfu_vs_hbm.png",
                "fat_tree_vs_flat.png",
            ],
        ),
    log:
        executed_notebook("datacenter-design"),
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=2000,
        runtime=study_runtime_min(quick=10, full=30),
    params:
        notebook=notebook_parameters("datacenter-design"),
    shell:
        PAPERMILL
