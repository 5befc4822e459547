# One rule per scaling study, generated from the study registry (trainscale.studies.registry): each
# study's module declares its OUTPUTS and RESOURCES; papermill runs notebooks/<study>.ipynb with the
# study's parameters for the current mode; the executed notebook is the log, and its published copy
# (outputs kept, no timestamps, figures linked) goes beside the figures for readers.
# To add a study: its module, notebooks/<study>.ipynb, a block in config/config.yaml (+ its
# $defs/params entry in config/schema.yaml) and its test; nothing here.
#
# Nothing is lost (trainscale.interface.workflow_outputs): the notebook writes into results/<mode>/staging/<study>/
# and `trainscale install-outputs` moves every output into place only when all of them are there; the
# outputs are flagged update(), so Snakemake neither deletes them before a job nor after a failed,
# cancelled or refused (SLURM) one. A study reruns when its fingerprint changes (rules/common.smk).

PAPERMILL = (
    "NUMBA_NUM_THREADS={threads} MPLBACKEND=Agg JUPYTER_PREFER_ENV_PATH=1 "
    'papermill --engine trainscale --kernel python3 --cwd "$PWD" --no-progress-bar '
    "{input.notebook:q} {log:q} -y {params.notebook:q}"
)
RUN_STAGE_INSTALL = (
    "rm -rf {params.staging:q} && mkdir -p {params.staging:q} && "
    f"{PAPERMILL} && "
    "trainscale publish-notebook {log:q} {params.staging:q}/{params.notebook_name:q} "
    "--shown-as {params.destination:q} && "
    "cp {input.fingerprint:q} {params.staging:q}/{params.fingerprint_name:q} && "
    "trainscale install-outputs {params.staging:q} {params.destination:q} {params.names}"
)


for study in STUDIES:
    sync_study_fingerprint(study)

    rule:
        name:
            study.rule
        input:
            notebook=ancient(study.notebook),
            fingerprint=fingerprint_file(study.name),
        output:
            [
                update(f"{study_dir(study.name)}/{name}")
                for name in study_output_names(study)
            ],
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
            staging=staging_dir(study.name),
            destination=lambda w, output: os.path.dirname(output[0]),
            notebook_name=f"{study.name}.ipynb",
            fingerprint_name=workflow_outputs.FINGERPRINT_FILE,
            names=" ".join(study_output_names(study)),
        shell:
            RUN_STAGE_INSTALL
