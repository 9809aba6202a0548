"""Checkpoints the qwen3 recipe serves, with sampling defaults quoted from the model cards."""

from ignition.recipes.base import Checkpoint, SamplingDefaults

# Qwen3 model card, "Best Practices" (../shared/model-cards/Qwen--Qwen3-8B.md, same block in the 0.6B card):
#   "For thinking mode (`enable_thinking=True`), use `Temperature=0.6`, `TopP=0.95`, `TopK=20`, and `MinP=0`.
#    **DO NOT use greedy decoding**"
#   "For supported frameworks, you can adjust the `presence_penalty` parameter between 0 and 2 to reduce
#    endless repetitions."
# The default serving mode is thinking (the template's default). The card gives a range only for
# presence_penalty; its default stays neutral (0). Frequency and repetition penalties: not mentioned -> neutral.
QWEN3_THINKING = SamplingDefaults(
    values={
        "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    },
    ranges={"presence_penalty": (0.0, 2.0)},
    citation="Qwen3 model card, Best Practices: thinking mode Temperature=0.6, TopP=0.95, TopK=20, MinP=0; "
    "presence_penalty between 0 and 2",
)

# The embedded default is the project's own tiny model: no model card exists, so sampling is neutral.
FLARE_DEFAULT_SAMPLING = SamplingDefaults(
    values={
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    },
    citation="project-owned embedded default: no model card; neutral values",
    verified=False,
)

CHECKPOINTS = (
    Checkpoint("default", "Qwen/Qwen3-8B", "qwen3", QWEN3_THINKING, hidden_size=4096),
    Checkpoint("small", "Qwen/Qwen3-0.6B", "qwen3", QWEN3_THINKING, hidden_size=1024),
    Checkpoint("embedded", "flare/embedded-default", "flare-default", FLARE_DEFAULT_SAMPLING, hidden_size=64,
               notes="the project's own tokenizer and ChatML template; no hub files"),
)
