# One rule per scaling study, generated from the study registry (trainscale.studies.registry): each
# study's module declares its OUTPUTS and RESOURCES; papermill runs notebooks/<study>.ipynb with the
# study's parameters for the current mode; the executed notebook is the log, and its published copy
# (outputs kept, no timestamps, figures linked) goes beside the figures for readers.
# To add a study: its module, notebooks/<study>.ipynb, a block in config/config.yaml (+ its
# $defs/params entry in config/schema.yaml) and its test; nothing here.

PAPERMILL = (
    'NUMBA_NUM_THREADS={threads} NUMBA_CACHE_DIR="${{NUMBA_CACHE_DIR:-$PWD/.numba_cache}}" '
    "MPLBACKEND=Agg JUPYTER_PREFER_ENV_PATH=1 "
    'papermill --engine trainscale --kernel python3 --cwd "$PWD" --no-progress-bar '
    "{input.notebook:q} {log:q} -y {params.notebook:q}"
)
RUN_AND_PUBLISH = (
    f"{PAPERMILL} && trainscale publish-notebook {{log:q}} {{output.notebook:q}}"
)


for study in STUDIES:

    rule:
        name:
            study.rule
        input:
            notebook=study.notebook,
            package=PACKAGE_FILES,
            folders=input_folder_files(study),
        output:
            study_outputs(study.name, study.all_outputs()),
            notebook=published_notebook(study.name),
        log:
            executed_notebook(study.name),
        conda:
            "../../environment.yml"
        threads: config["numba_threads"]
        resources:
            mem_mb=study.resources["mem_mb"],
            runtime=study_runtime_min(
                quick=study.resources["runtime_quick_min"],
                full=study.resources["runtime_full_min"],
            ),
        params:
            notebook=notebook_parameters(study.name),
        shell:
            RUN_AND_PUBLISH
