"""Checkpoints the qwen3_5 recipe serves, with sampling defaults quoted from the model card."""

from ignition.recipes.base import Checkpoint, SamplingDefaults

# Qwen3.5-4B model card (../shared/model-cards/Qwen--Qwen3.5-4B.md). The card README itself was NOT
# obtained; its sampling block is quoted word for word by four third-party sources that agree:
#   "We recommend using the following set of sampling parameters for generation
#    - Thinking mode for general tasks: temperature=1.0, top_p=0.95, top_k=20, min_p=0.0,
#      presence_penalty=1.5, repetition_penalty=1.0"
# The default serving mode is thinking (the template thinks unless enable_thinking is false), general
# tasks. The card states no ranges, so every parameter is fixed at its default. frequency_penalty is not
# mentioned -> neutral (0).
QWEN3_5_THINKING_GENERAL = SamplingDefaults(
    values={
        "temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
        "presence_penalty": 1.5, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    },
    citation="Qwen3.5-4B model card (quoted via third parties; README not obtained): thinking mode for general "
    "tasks: temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=1.5, repetition_penalty=1.0",
)

CHECKPOINTS = (
    Checkpoint("default", "Qwen/Qwen3.5-4B", "qwen3_5", QWEN3_5_THINKING_GENERAL, hidden_size=2560),
)
