"""What users run: the ``trainscale`` CLI (:mod:`.cli`, one module per command group), the explore widgets
(:mod:`.explore`) and the studies' interactive figures (:mod:`.explore_figures`), the docs and report
(:mod:`.docs`), ``verify`` (:mod:`.verify`), the papermill engine and the workflow's output installer. The top
layer: nothing below imports it."""
