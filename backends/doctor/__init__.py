"""`doctor`: why SGLang would drop, skip or refuse an EAGLE-3 draft, found from files alone.

SGLang loads a draft without a word about names it does not know and parameters
it never fills, and it skips `fc` when the target's features are one layer
wide; either way acceptance collapses to about 1.0. `diagnose` reads only
config.json files, safetensors headers (and the small `d2t` vector), an
original-EAGLE `pytorch_model.bin` through a memory map, and the extraction
manifest, and turns every such fault into a finding with a stable code and a
fix. It never raises for any file content. The SGLang knowledge it applies
lives in `backends.sglang.facts`; `dryload` is the exact check with the real loader.

    python -m backends.doctor DRAFT [--target DIR] [--data DIR] [--sglang-version V]
                             [--context-length N] [--json] [--dry-load] [--sglang-python PATH]

Modules: `codes` (the finding codes), `weight_files` (which files of a draft
folder SGLang loads, and the leftovers), `reading` (the draft, target and manifest
files), `layer_names` and `config_values` (spellings and typed values of what
was read), `draft_config` (the config as SGLang sees it), `rule_context` (what
the rules see), the rules by concept (`config_rules`, `shape_rules`,
`vocab_rules`, `target_rules`, `weight_name_rules`, `capture_rules`,
`feature_rules`) and their order (`rules`), `versions` (which SGLang releases),
`diagnosis` (`diagnose`), `full` (the rules and the real loader's dry-load,
`dryload`, together), `report` (a result as text), `cli` (the command line),
`convert` (other layouts to SGLang's).
"""

from backends.doctor.capture_rules import Capture
from backends.doctor.codes import CODES, CONVERT_FIX, convert_fix, finding
from backends.doctor.diagnosis import diagnose
from backends.doctor.draft_config import Geometry, aux_ids, enabled_options, geometry, num_aux, sglang_view
from backends.doctor.reading import (
    MAX_D2T_BYTES,
    DraftFiles,
    Target,
    TensorMeta,
    detect_format,
    read_data,
    read_draft,
    read_json_object,
    read_target,
)
from backends.doctor.rule_context import Context
from backends.doctor.rules import release_rules, version_independent_rules

__all__ = [
    "CODES",
    "CONVERT_FIX",
    "MAX_D2T_BYTES",
    "Capture",
    "Context",
    "DraftFiles",
    "Geometry",
    "Target",
    "TensorMeta",
    "aux_ids",
    "convert_fix",
    "detect_format",
    "diagnose",
    "enabled_options",
    "finding",
    "geometry",
    "num_aux",
    "read_data",
    "read_draft",
    "read_json_object",
    "read_target",
    "release_rules",
    "sglang_view",
    "version_independent_rules",
]
