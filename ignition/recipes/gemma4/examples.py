"""Checkpoints the gemma4 recipe serves, with sampling defaults quoted from the model card."""

from ignition.recipes.base import Checkpoint, SamplingDefaults

# Gemma 4 model card, "Best Practices" (../shared/model-cards/google--gemma-4-31B-it.md; the card is shared by
# E2B/E4B/12B/26B-A4B/31B and google--gemma-4-E4B-it.md quotes the same block):
#   "### 1. Sampling Parameters
#    Use the following standardized sampling configuration across all use cases:
#    * `temperature=1.0`
#    * `top_p=0.95`
#    * `top_k=64`"
# "across all use cases": the same values with thinking on or off. The card says nothing about min_p or any
# penalty: min_p is disabled (0) and the penalties are neutral. The card recommends no ranges, so every
# parameter is fixed at its default.
GEMMA4 = SamplingDefaults(
    values={
        "temperature": 1.0, "top_p": 0.95, "top_k": 64, "min_p": 0.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    },
    citation="Gemma 4 model card, Best Practices, 1. Sampling Parameters: \"Use the following standardized "
    "sampling configuration across all use cases: temperature=1.0, top_p=0.95, top_k=64\"; min_p and penalties "
    "not mentioned (disabled/neutral); no ranges",
)

CHECKPOINTS = (
    # The hub cache holds no config.json for 31B, so the reference tokenizer is GemmaTokenizer (AutoTokenizer fails).
    Checkpoint("default", "google/gemma-4-31B-it", "google", GEMMA4, hidden_size=5376, tokenizer_class="gemma"),
    Checkpoint("e4b", "google/gemma-4-E4B-it", "google-e2b-e4b", GEMMA4, hidden_size=2560),
)
