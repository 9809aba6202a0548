"""Checkpoints the deepseek_v3 recipe serves, with sampling defaults quoted from the model cards."""

from ignition.recipes.base import NEUTRAL_SAMPLING, Checkpoint, SamplingDefaults

# DeepSeek-V3 (../shared/model-cards/deepseek-ai--DeepSeek-V3.md): the model card README was NOT obtained and
# no sampling recommendation is quoted (the repository ships no generation_config.json either). Nothing is
# inferred from config files or other models: every parameter is neutral and unverified.
DEEPSEEK_V3_UNVERIFIED = SamplingDefaults(
    values=dict(NEUTRAL_SAMPLING),
    citation="DeepSeek-V3 model card not obtained; no sampling recommendation quoted; neutral values",
    verified=False,
)

# DeepSeek-R1 model card, "Usage Recommendations" (../shared/model-cards/deepseek-ai--DeepSeek-R1.md, read from
# a public copy of the GitHub README):
#   "1. Set the temperature within the range of 0.5-0.7 (0.6 is recommended) to prevent endless repetitions
#    or incoherent outputs."
# The author's range is declared for temperature only; the card names no other parameter -> filters
# disabled, penalties neutral, fixed at those values.
DEEPSEEK_R1 = SamplingDefaults(
    values={**NEUTRAL_SAMPLING, "temperature": 0.6},
    ranges={"temperature": (0.5, 0.7)},
    citation="DeepSeek-R1 model card, Usage Recommendations: 'Set the temperature within the range of 0.5-0.7 "
    "(0.6 is recommended)'; no other parameter recommended",
)

CHECKPOINTS = (
    Checkpoint("default", "deepseek-ai/DeepSeek-V3", "deepseek_v3", DEEPSEEK_V3_UNVERIFIED, hidden_size=7168),
    Checkpoint(
        "r1", "deepseek-ai/DeepSeek-R1", "deepseek_v3", DEEPSEEK_R1, hidden_size=None,
        notes="The hub cache holds only R1's tokenizer.json: no tokenizer_config.json (so no chat template) and "
        "no config.json (geometry not declared here). Rendering is skipped with the missing file named; R1's "
        "published template differs from V3's and would be rejected by the deepseek_v3 patch's source hash, "
        "so serving R1 needs its own annotated variant once its template is available.",
    ),
)
