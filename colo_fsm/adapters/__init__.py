"""Adapter protocols (engine, trainer, collector) and the adapters colo-fsm ships."""

from colo_fsm.adapters.protocols import Collector, GenerationEngine, StepResult, Trainer

__all__ = ["Collector", "GenerationEngine", "StepResult", "Trainer"]
