"""Adapter protocols (engine, trainer, collector) and the adapters colo-fsm ships."""

from colo_fsm.adapters.protocols import Collector, Completion, GenerationEngine, StepResult, TextGenerator, Trainer

__all__ = ["Collector", "Completion", "GenerationEngine", "StepResult", "TextGenerator", "Trainer"]
