"""Every rule, in the order doctor runs them: those that hold for any SGLang release, then one release's."""

from __future__ import annotations

from backends.doctor.config_rules import (
    draft_vocab_size_rules,
    release_config_rules,
    tied_embeddings_rule,
    too_many_layers,
)
from backends.doctor.config_values import first_architecture
from backends.doctor.feature_rules import feature_rules
from backends.doctor.layer_names import canonical_names
from backends.doctor.rule_context import Context
from backends.doctor.shape_rules import shape_rules
from backends.doctor.target_rules import context_length_rule, manifest_rules, target_hidden_size_rule
from backends.doctor.vocab_rules import vocab_rules
from backends.doctor.weight_name_rules import weight_name_rules
from backends.protocol import Finding
from backends.sglang import facts


def version_independent_rules(ctx: Context) -> list[Finding]:
    canon = canonical_names(ctx.files.tensors)
    found = draft_vocab_size_rules(ctx)
    if ctx.geo is None:
        return found
    found += tied_embeddings_rule(ctx, canon)
    found += shape_rules(ctx, canon)
    found += vocab_rules(ctx, canon)
    found += context_length_rule(ctx)
    found += target_hidden_size_rule(ctx)
    found += manifest_rules(ctx)
    return found


def release_rules(ctx: Context, release: facts.ReleaseFacts) -> list[Finding]:
    """Rules whose outcome depends on the SGLang release."""
    found = release_config_rules(ctx, release)
    multi_layer = too_many_layers(ctx.view, release)
    if ctx.geo is not None and first_architecture(ctx.view) != facts.MLA_DRAFT and not multi_layer:
        found += weight_name_rules(ctx, release)
    if ctx.geo is not None:
        found += feature_rules(ctx, release)
    return found
