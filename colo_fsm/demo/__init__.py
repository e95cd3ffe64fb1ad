"""The end-to-end demo: asynchronous GRPO on a tiny megatron-core GPT, driven by the colocation lifecycle.

Run it with ``colo-fsm demo`` or ``python -m colo_fsm.demo`` (``--help`` lists the options).
"""
