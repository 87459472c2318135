"""Draft folders as people leave them (shards, indexes, leftovers, .bin): doctor's static reader, its dry-load and
SGLang 0.5.23's real loader read the same files and agree.

The dry-load and the real loader run in the real-SGLang tier (fixture sglang_python, never skipped under `make
test`). The real loader is SGLang's own DefaultModelLoader on a copy of the whole folder, every file in place
(tests/sglang_real_loader.py): it picks the files itself. Nothing here is a stand-in.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.doctor import diagnose
from backends.doctor.convert import ConvertError, convert
from backends.doctor.full import full_diagnosis
from backends.doctor.weight_files import WeightFilesError, weight_files
from backends.protocol import Finding
from backends.safetensors_header import INDEX_FILE
from tests.draft_fixtures import (
    HIDDEN,
    DraftSpec,
    bin_draft,
    good_draft,
    shard_name,
    sharded_draft,
    stale_single_file,
)
from tests.sglang_tier import DRY_LOAD, REAL_LOADER, in_tier

SHARDS = (shard_name(0, 2), shard_name(1, 2))
EMBEDDING = "model.embed_tokens.weight"
DOWN_PROJ = "midlayer.mlp.down_proj.weight"


@dataclass(frozen=True)
class Layout:
    """What SGLang does with a draft folder: the files it loads, the weight files it leaves, the parameters it
    leaves unwritten (besides the embedding, taken from the target), or the file whose absence stops it."""

    build: Callable[[Path], Path]
    files: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()
    unwritten: tuple[str, ...] = ()
    missing: str | None = None
    duplicated: bool = False


def _without_second_shard(folder: Path) -> Path:
    sharded_draft(folder)
    (folder / SHARDS[1]).unlink()
    return folder


def _junk_bin_beside(folder: Path) -> Path:
    good_draft(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not a checkpoint, a leftover of some copy\n")
    return folder


LAYOUTS = {
    "sharded-with-index": Layout(sharded_draft, files=SHARDS),
    "sharded-beside-a-stale-complete-file": Layout(
        lambda f: stale_single_file(sharded_draft(f)), files=SHARDS, leftovers=("model.safetensors",)
    ),
    "beside-a-stale-file-of-another-shape": Layout(
        lambda f: stale_single_file(sharded_draft(f), DraftSpec(fc_in=2 * HIDDEN, draft_vocab=32)),
        files=SHARDS,
        leftovers=("model.safetensors",),
    ),
    # The stale file holds the tensor the shards lack: SGLang never reads it, so the parameter stays unwritten.
    "stale-file-hides-a-missing-tensor": Layout(
        lambda f: stale_single_file(sharded_draft(f, DraftSpec(drop=(DOWN_PROJ,)))),
        files=SHARDS,
        leftovers=("model.safetensors",),
        unwritten=("model.layers.0.mlp.down_proj.weight",),
    ),
    "index-names-a-missing-shard": Layout(_without_second_shard, missing=SHARDS[1]),
    "bin-only": Layout(bin_draft, files=("pytorch_model.bin",)),
    "safetensors-and-a-junk-bin": Layout(
        _junk_bin_beside, files=("model.safetensors",), leftovers=("pytorch_model.bin",)
    ),
    # No index: SGLang loads every file, each tensor twice, and serves the later copy.
    "shards-and-a-stale-copy-without-index": Layout(
        lambda f: stale_single_file(sharded_draft(f, index=False)),
        files=tuple(sorted((*SHARDS, "model.safetensors"))),
        duplicated=True,
    ),
}


@pytest.fixture(scope="module")
def three_verdicts(
    sglang_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[list[Finding], list[Finding], dict[str, Any]]]:
    """Each layout's static findings (doctor's rules for 0.5.23), dry-load findings and real loader verdict."""
    root = tmp_path_factory.mktemp("layouts")
    drafts = {case: layout.build(root / case) for case, layout in LAYOUTS.items()}
    paths = [str(p) for p in drafts.values()]
    dry = in_tier(sglang_python, "-c", DRY_LOAD, *paths)
    real = in_tier(sglang_python, str(REAL_LOADER), *paths)
    return {
        case: (diagnose(path, sglang_version="0.5.23")["findings"], dry[str(path)], real[str(path)])
        for case, path in drafts.items()
    }


def _errors(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f["severity"] == "error"]


def _one(found: list[Finding], code: str) -> Finding | None:
    matches = [f for f in found if f["code"] == code]
    assert len(matches) <= 1, matches
    return matches[0] if matches else None


@pytest.mark.parametrize("case", LAYOUTS)
def test_static_reader_dry_load_and_sglangs_loader_agree(
    case: str, three_verdicts: dict[str, tuple[list[Finding], list[Finding], dict[str, Any]]]
) -> None:
    layout = LAYOUTS[case]
    static, dry, real = three_verdicts[case]
    # SGLang's real loader: the files it picks, what it leaves unwritten, or why it stops.
    if layout.missing:
        assert "error" in real
        assert "references 1 shard file(s) missing" in real["error"] and layout.missing in real["error"]
    else:
        assert real["files"] == list(layout.files) and real["ignored"] == [] and real["hot_token_id_ok"], real
        assert set(real["unwritten"]) == {EMBEDDING, *layout.unwritten}
    # doctor's static reader and its dry-load, as a user reads them.
    for found in (static, dry):
        if layout.missing:
            [error] = _errors(found)
            assert error["code"] == "draft-not-found"
            assert "names 1 shard file(s) missing from" in error["message"]
            assert error["message"].endswith(f": {layout.missing} (SGLang would fail to start)")
            continue
        leftover = _one(found, "weights-leftover")
        if layout.leftovers:
            assert leftover is not None and leftover["severity"] == "warning"
            assert leftover["message"].startswith(f"SGLang never loads {', '.join(layout.leftovers)} from ")
            assert leftover["message"].endswith(
                f": it loads {', '.join(layout.files)}"
                + (f" (as {INDEX_FILE} names them)" if layout.files == SHARDS else "")
            )
        else:
            assert leftover is None
        duplicated = _one(found, "weights-duplicated")
        assert (duplicated is not None and duplicated["severity"] == "warning") == layout.duplicated
        assert _one(found, "dry-load-unconsumed") is None  # no false "ignored N tensors"
    unwritten = ", ".join(f"{n} (100%)" for n in layout.unwritten)
    if layout.unwritten:
        assert [f["code"] for f in _errors(static)] == ["weights-missing"]
        assert "mlp.down_proj" in _errors(static)[0]["message"]
        [error] = _errors(dry)
        assert error["code"] == "dry-load-unwritten" and unwritten in error["message"]
    elif not layout.missing:
        assert _errors(static) == [] and _errors(dry) == []
        assert _one(dry, "dry-load-unwritten") == {
            "code": "dry-load-unwritten",
            "severity": "info",
            "message": "SGLang 0.5.23's loader consumed every tensor and wrote every parameter but "
            f"{EMBEDDING} (taken from the target)",
            "fix": None,
        }
    # The three agree on the verdict that decides a launch.
    assert (
        bool(_errors(static)) == bool(_errors(dry)) == ("error" in real or bool(set(real["unwritten"]) - {EMBEDDING}))
    )


def test_doctor_names_the_files_it_read(tmp_path: Path) -> None:
    draft = stale_single_file(sharded_draft(tmp_path / "draft"))
    [fmt] = [f for f in diagnose(draft, sglang_version="0.5.23")["findings"] if f["code"] == "draft-format"]
    assert fmt["message"].startswith(f"SpecForge/SGLang layout: 15 tensors in {', '.join(SHARDS)} (as {INDEX_FILE}")


def test_the_gate_lets_a_sharded_draft_with_a_stale_file_through(sglang_python: Path, tmp_path: Path) -> None:
    """The pre-launch gate's verdict (full_diagnosis with the serving Python's dry-load): warnings, no error."""
    draft = stale_single_file(sharded_draft(tmp_path / "draft"), DraftSpec(fc_in=2 * HIDDEN))
    result = full_diagnosis(draft, dry_load=True, sglang_python=str(sglang_python))
    assert result["errors"] == 0, result["findings"]
    leftovers = [f for f in result["findings"] if f["code"] == "weights-leftover"]
    assert len(leftovers) == 1  # said once, though the static reader and the dry-load both found it


def test_a_stale_copy_of_another_shape_without_index_is_an_error(tmp_path: Path) -> None:
    """Both copies load, and one of them cannot fit the parameter: SGLang's loader asserts at startup."""
    draft = stale_single_file(sharded_draft(tmp_path / "draft", index=False), DraftSpec(fc_in=2 * HIDDEN))
    [error] = [
        f for f in _errors(diagnose(draft, sglang_version="0.5.23")["findings"]) if f["code"] == "weights-duplicated"
    ]
    assert (
        f"fc.weight in model-00001-of-00002.safetensors [{HIDDEN}, {3 * HIDDEN}] and model.safetensors"
        in (error["message"])
    )


def test_convert_reads_the_files_sglang_loads(tmp_path: Path) -> None:
    """A layers.0 draft in shards beside a stale midlayer file: convert takes the shards, never the leftover."""
    draft = stale_single_file(sharded_draft(tmp_path / "draft", DraftSpec(layer="layers.0")), DraftSpec(fc_in=HIDDEN))
    result = convert(draft, tmp_path / "out")
    assert result["errors"] == 0
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as fh:
        assert fh.get_slice("fc.weight").get_shape() == [HIDDEN, 3 * HIDDEN]
    with pytest.raises(ConvertError, match=f"missing from .*: {SHARDS[1]} \\(SGLang would fail to start\\)"):
        convert(_without_second_shard(tmp_path / "broken"), tmp_path / "out2")


# --- which files, against SGLang's own _prepare_weights on many folders -------------------------------------------

NAMES = (
    "model.safetensors",
    *SHARDS,
    "consolidated.safetensors",
    ".hidden.safetensors",
    "pytorch_model.bin",
    "pytorch_model-00001-of-00002.bin",
    "training_args.bin",
    "model.pt",
    "optimizer.pt",
    "training_state.pt",
)
PICK = "import json, sys; from pathlib import Path; from tests.sglang_real_loader import picked_files; " + (
    "print(json.dumps({d: picked_files(Path(d)) for d in sys.argv[1:]}))"
)


def _random_folders(root: Path, count: int) -> list[Path]:
    """Folders of random weight-file names, half with an index naming a random few (some not there)."""
    rng = random.Random(22)
    folders = []
    for i in range(count):
        folder = root / f"f{i}"
        folder.mkdir()
        for name in rng.sample(NAMES, rng.randint(1, 5)):
            (folder / name).write_bytes(b"x")
        if rng.random() < 0.5:
            named = rng.sample([n for n in NAMES if n.endswith(".safetensors")], rng.randint(1, 3))
            (folder / INDEX_FILE).write_text(json.dumps({"weight_map": {f"t{j}": n for j, n in enumerate(named)}}))
        folders.append(folder)
    return folders


def test_the_file_choice_is_sglangs_on_every_folder(sglang_python: Path, tmp_path: Path) -> None:
    folders = _random_folders(tmp_path, 120)
    real = in_tier(sglang_python, "-c", PICK, *map(str, folders))
    for folder in folders:
        sglang = real[str(folder)]
        try:
            ours = weight_files(folder)
        except WeightFilesError as exc:
            assert "error" in sglang, (folder, sorted(p.name for p in folder.iterdir()), str(exc), sglang)
            continue
        assert sglang == {"files": [f.name for f in ours.files]}, (sorted(p.name for p in folder.iterdir()), ours)
