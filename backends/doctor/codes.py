"""Every finding code doctor gives, how a finding is made, and the fix text several rules share."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from backends.protocol import Finding, Severity

# Every finding code, with what it means (stable: tools and docs key on them).
CODES: Mapping[str, str] = {
    "draft-format": "which checkpoint layout the draft is in (SGLang/SpecForge, speculators, original EAGLE bin)",
    "draft-not-found": "the draft folder, its config.json or its weights file is missing",
    "config-unreadable": "a config.json is not a JSON object",
    "config-invalid": "a draft config field SGLang needs is missing or not a valid value",
    "weights-unreadable": "the weights file is truncated, corrupt, or its header lies about the data",
    "weights-leftover": "weight files in the draft folder that SGLang's loader never opens (not in the index, "
    "or .bin beside .safetensors)",
    "weights-duplicated": "a tensor is in more than one of the files SGLang loads",
    "sglang-version": "which SGLang release(s) the draft was checked against",
    "architecture": "config `architectures` is not an EAGLE-3 draft class this SGLang release knows",
    "model-type": "config `model_type` is one transformers cannot load as the draft's config class",
    "draft-vocab-size": "`draft_vocab_size` is missing or larger than `vocab_size`",
    "tied-embeddings": "`tie_word_embeddings` is true, so a separate lm_head is ignored",
    "num-layers": "`num_hidden_layers` is not 1 on a release that supports only one draft layer",
    "unsupported-option": "the config turns on a draft option this release does not implement",
    "weights-dropped": "checkpoint tensors SGLang's loader would skip without a word",
    "weights-missing": "draft parameters SGLang's loader would leave uninitialised",
    "weight-shape": "a tensor's shape disagrees with the config (SGLang's loader asserts: startup crash)",
    "fc-width": "`fc.weight` does not match num_aux x target_hidden_size -> hidden_size",
    "single-layer-features": "SGLang would feed one layer's features, so it never applies the trained fc",
    "aux-count-mismatch": "the width of the features SGLang captures differs from what fc takes",
    "lm-head-rows": "`lm_head.weight` rows differ from `draft_vocab_size`",
    "d2t-missing": "no `d2t` although the draft vocabulary is smaller than the target's",
    "d2t-length": "`d2t` length differs from `draft_vocab_size`",
    "d2t-range": "`d2t` maps draft ids outside the target vocabulary, or not one to one",
    "vocab-mismatch": "the draft's `vocab_size` or embedding differs from the target's vocabulary",
    "target-unreadable": "the target folder's config.json or weights cannot be read",
    "target-hidden-size": "the draft's `target_hidden_size` differs from the target's hidden size",
    "target-no-capture": "the target class cannot capture EAGLE-3 aux hidden states in this release",
    "aux-layers": "which aux layers the draft config, the manifest and SGLang name",
    "aux-ids-ignored": "aux layer ids outside `eagle_config`, where SGLang never reads them",
    "aux-layers-mismatch": "SGLang would capture other layers than the draft was trained on",
    "aux-layers-out-of-range": "an aux layer SGLang would capture does not exist in the target",
    "aux-layers-cuda-graph": "custom aux layers reach CUDA-graph replays only as the defaults (SGLang 0.5.5)",
    "manifest-missing": "the extraction folder has no manifest.json, so the trained aux layers are unknown",
    "manifest-invalid": "manifest.json cannot be read or breaks the contract",
    "manifest-mismatch": "the extraction manifest describes another target or draft geometry",
    "context-length": "the draft's context length is shorter than the target's (startup fails)",
    "doctor-failed": "doctor itself failed on this input (a bug: please report it)",
    "dry-load-skipped": "the dry-load with SGLang's own loader did not run",
    "dry-load-failed": "SGLang's own loader raised while building or loading the draft",
    "dry-load-unconsumed": "checkpoint tensors SGLang's real loader did not consume",
    "dry-load-unwritten": "draft parameters SGLang's real loader left unwritten",
}

CONVERT_FIX = "eagle3-console HOST convert {src} {dst} (writes the SGLang layout beside it)"


def finding(code: str, severity: Severity, message: str, fix: str | None = None) -> Finding:
    if code not in CODES:
        raise KeyError(f"unregistered finding code {code!r}")
    return {"code": code, "severity": severity, "message": message, "fix": fix}


def convert_fix(draft: Path) -> str:
    return CONVERT_FIX.format(src=draft, dst=f"{draft}-sglang")
