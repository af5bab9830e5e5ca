"""GRPO family: advantage estimators and losses (``core``); needs ``fulgor[torch]``."""
