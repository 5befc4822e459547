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
