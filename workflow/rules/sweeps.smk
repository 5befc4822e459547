# Sweeps that split: a plan sweep too large for one job is cut into chunks, each evaluated as its
# own job (locally or on SLURM), then gathered into one dataset identical to the unsplit
# evaluation (netCDF, or a zarr store when large). A notebook sweep runs one study notebook per
# parameter set and stacks their datasets along `parameter_set`.
rule sweep_chunk:
    input:
        package=PACKAGE_FILES,
    output:
        f"{SWEEPS_DIR}/{{sweep}}/chunk-{{chunk}}.nc",
    log:
        f"{SWEEPS_DIR}/logs/{{sweep}}-chunk-{{chunk}}.log",
    wildcard_constraints:
        sweep=PLAN_SWEEPS,
        chunk=r"\d+",
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=4000,
        runtime=study_runtime_min(quick=10, full=60),
    params:
        spec=lambda w: json.dumps(sweep_spec(w.sweep), sort_keys=True),
        chunks=lambda w: int(sweep_spec(w.sweep).get("chunks", 1)),
    shell:
        "NUMBA_NUM_THREADS={threads} python -m trainscale.model.sweep chunk {params.spec:q} "
        "--chunk {wildcards.chunk} --chunks {params.chunks} --out {output:q} 2> {log:q}"


rule sweep_gather_netcdf:
    input:
        sweep_chunks,
    output:
        f"{SWEEPS_DIR}/{{sweep}}.nc",
    log:
        f"{SWEEPS_DIR}/logs/{{sweep}}-gather.log",
    wildcard_constraints:
        sweep=PLAN_SWEEPS,
    conda:
        "../../environment.yml"
    resources:
        mem_mb=8000,
        runtime=study_runtime_min(quick=10, full=60),
    params:
        spec=lambda w: json.dumps(sweep_spec(w.sweep), sort_keys=True),
    shell:
        "python -m trainscale.model.sweep gather {params.spec:q} --out {output:q} {input:q} 2> {log:q}"


rule sweep_gather_zarr:
    input:
        sweep_chunks,
    output:
        directory(f"{SWEEPS_DIR}/{{sweep}}.zarr"),
    log:
        f"{SWEEPS_DIR}/logs/{{sweep}}-gather-zarr.log",
    wildcard_constraints:
        sweep=PLAN_SWEEPS,
    conda:
        "../../environment.yml"
    resources:
        mem_mb=16000,
        runtime=study_runtime_min(quick=10, full=60),
    params:
        spec=lambda w: json.dumps(sweep_spec(w.sweep), sort_keys=True),
    shell:
        "python -m trainscale.model.sweep gather {params.spec:q} --out {output:q} {input:q} 2> {log:q}"


rule notebook_sweep_set:
    input:
        notebook=lambda w: study_notebook(notebook_sweep(w.name)[0]["study"]),
        package=PACKAGE_FILES,
    output:
        directory(f"{SWEEPS_DIR}/{{name}}/set-{{index}}"),
    log:
        f"{SWEEPS_DIR}/notebooks/{{name}}-set-{{index}}.ipynb",
    conda:
        "../../environment.yml"
    threads: config["numba_threads"]
    resources:
        mem_mb=4000,
        runtime=study_runtime_min(quick=15, full=120),
    params:
        notebook=notebook_sweep_parameters,
    shell:
        PAPERMILL


rule notebook_sweep_combine:
    input:
        notebook_sweep_sets,
    output:
        f"{SWEEPS_DIR}/{{name}}.nc",
    log:
        f"{SWEEPS_DIR}/logs/{{name}}-combine.log",
    wildcard_constraints:
        name="|".join(config.get("notebook_sweeps", {})) or "^$",
    conda:
        "../../environment.yml"
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        files=lambda w, input: [
            f"{d}/{notebook_sweep(w.name)[0]['dataset']}" for d in input
        ],
        labels=lambda w: [str(i) for i in range(len(notebook_sweep(w.name)[1]))],
    shell:
        "python -m trainscale.model.sweep combine --out {output:q} --dim parameter_set "
        "--labels {params.labels} -- {params.files:q} 2> {log:q}"


rule sweeps:
    input:
        all_sweep_outputs(),
