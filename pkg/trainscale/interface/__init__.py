"""What users run: the ``trainscale`` CLI (:mod:`.cli`), the explore widgets (:mod:`.explore`), the docs and
report (:mod:`.docs`), ``verify`` (:mod:`.verify`), the papermill engine and the workflow's output installer. The
top layer: nothing below imports it."""
