"""Study-level computations, one module per study (``trainscale.studies.<name_with_underscores>``): each
returns the xarray Datasets its notebook draws figures from and declares what :mod:`.registry` reads
(``PAPER``, ``OUTPUTS``, ``RESOURCES``, ``compare``). Notebooks import their own module, e.g.
``from trainscale.studies import hardware_scaling as study``.
"""
