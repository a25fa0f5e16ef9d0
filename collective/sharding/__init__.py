"""Where every table lives: the plan (:mod:`.plan`), the planner (:mod:`.planner`), the plan of this run
(:mod:`.runtime`) and the shards made from it (:mod:`.shards`)."""

from collective.sharding.plan import PLACEMENTS, PlanError, ShardingPlan, TablePlan
from collective.sharding.planner import CostModel, TableSpec, World, plan

__all__ = ["PLACEMENTS", "PlanError", "ShardingPlan", "TablePlan", "CostModel", "TableSpec", "World", "plan"]
