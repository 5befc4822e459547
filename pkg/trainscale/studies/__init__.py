"""Study-level computations: each function returns the xarray Dataset one study's figures are drawn from.

``cluster``: the performance-model studies (hardware scaling, all-reduce bus bandwidth, pipeline
schedules and planner, heterogeneous mixes); the convergence studies live in one module each
(``trainscale.studies.<module>``), imported by their notebooks.
"""

from .cluster import (STRATEGIES, SCHEDULE_NAMES, allreduce_busbw, hardware_scaling, heterogeneous_mix,
                      pipeline_planner, pipeline_schedules, pipeline_stage_times, strategy_space)

__all__ = ["STRATEGIES", "SCHEDULE_NAMES", "allreduce_busbw", "hardware_scaling", "heterogeneous_mix",
           "pipeline_planner", "pipeline_schedules", "pipeline_stage_times", "strategy_space"]
