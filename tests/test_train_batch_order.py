"""The order an epoch's samples are batched in (`--batch-order`): online, batches of similar lengths by default,
since the target's forward runs on each batch padded to its longest chat. Grouping keeps the random order's
samples and never pads more; its batches come in random order; a resume refuses another order. Real files and
the real trainer on the demo target (CPU)."""

from __future__ import annotations

import itertools
import random
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.extract.data import DEMO
from backends.train import distributed
from backends.train.__main__ import main
from backends.train.data import GROUP_BATCHES, GROUPED, RANDOM, length_grouped
from backends.train.errors import TrainError
from backends.train.loop import check_same_order, prepare
from backends.train.online import OnlineSource
from backends.train.options import TrainOptions
from tests.test_train_online import losses, online

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def batch_widths(indices: list[int], lengths: list[int], global_batch: int) -> list[int]:
    return [max(lengths[i] for i in indices[s : s + global_batch]) for s in range(0, len(indices), global_batch)]


@given(
    lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=600),
    global_batch=st.integers(1, 12),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
)
def test_grouping_keeps_the_random_orders_samples_and_never_pads_more(
    lengths: list[int], global_batch: int, seed: int, epoch: int
) -> None:
    indices = list(range(len(lengths)))
    random.Random(seed).shuffle(indices)
    usable = indices[: len(indices) - len(indices) % global_batch]
    grouped = length_grouped(indices, lengths, global_batch, seed, epoch)
    assert sorted(grouped) == sorted(usable)  # the partial batch the random order drops, and only it
    assert grouped == length_grouped(indices, lengths, global_batch, seed, epoch)  # a resume finds it again
    # Each GROUP_BATCHES batches' samples are cut at sorted boundaries: no two of their batches overlap in length.
    span = global_batch * GROUP_BATCHES
    chunk_of = {i: n // span for n, i in enumerate(usable)}
    batches = [grouped[s : s + global_batch] for s in range(0, len(grouped), global_batch)]
    for a, b in itertools.combinations(batches, 2):
        if chunk_of[a[0]] == chunk_of[b[0]]:
            ranges = sorted(
                [
                    (min(lengths[i] for i in a), max(lengths[i] for i in a)),
                    (min(lengths[i] for i in b), max(lengths[i] for i in b)),
                ]
            )
            assert ranges[0][1] <= ranges[1][0]
    # The random order's batches are another partition of the same chunks; sorted cuts minimise the sum of the
    # widths: the padded tokens.
    assert sum(batch_widths(grouped, lengths, global_batch)) <= sum(batch_widths(usable, lengths, global_batch))


def test_grouped_batches_come_in_random_order_not_sorted() -> None:
    """Sorted chunks in sequence would make the loss curve a sawtooth of short and long batches."""
    rng = random.Random(7)
    lengths = [rng.randint(20, 2048) for _ in range(GROUP_BATCHES * 8 * 6)]
    indices = list(range(len(lengths)))
    widths = batch_widths(length_grouped(indices, lengths, 8, seed=0, epoch=0), lengths, 8)
    rising = sum(b > a for a, b in itertools.pairwise(widths)) / (len(widths) - 1)
    assert 0.4 < rising < 0.6
    assert length_grouped(indices, lengths, 8, seed=0, epoch=1) != length_grouped(indices, lengths, 8, 0, 0)


def test_online_training_groups_by_length_and_says_what_padding_that_saves(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(online(target, tmp_path / "grouped", "--steps", "2", "--eval-every", "0")) == 0
    said = r"batches grouped by length: the target's forward runs on (\d+)% padding \(in random order: (\d+)%\)"
    line = re.search(said, capsys.readouterr().out)
    assert line is not None
    grouped, random_order = int(line[1]), int(line[2])
    assert grouped < random_order / 2  # the demo chats vary in length: 5% against 30% at batch 8
    argv = online(target, tmp_path / "random", "--steps", "2", "--eval-every", "0", "--batch-order", "random")
    assert main(argv) == 0
    assert f"batches in random order: the target's forward runs on {random_order}% padding" in capsys.readouterr().out


def test_a_resume_refuses_another_order_or_another_global_batch_in_one_line(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Grouping depends on the global batch; the samples a resume skips are the ones consumed only in the
    same order (test_train_online's resume test shows that a grouped run resumes exactly)."""
    first = tmp_path / "first"
    assert main(online(target, first, "--steps", "4", "--save-every", "2", "--eval-every", "0")) == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(first / "step-2", resumed / "step-2")
    capsys.readouterr()
    assert main(online(target, resumed, "--steps", "4", "--resume", "--batch-order", "random")) == 2
    err = capsys.readouterr().err
    assert "drew its batches in grouped order: resume with --batch-order grouped" in err and err.count("\n") == 1
    halved = online(target, resumed, "--steps", "4", "--resume")
    halved[halved.index("--batch-size") + 1] = "4"
    assert main(halved) == 2
    err = capsys.readouterr().err
    assert "for a global batch of 8, this run's is 4" in err and err.count("\n") == 1
    assert main(online(target, resumed, "--steps", "4", "--resume")) == 0
    assert losses(resumed)[4] == pytest.approx(losses(first)[4], rel=1e-5)


def test_a_checkpoint_from_before_orders_were_recorded_resumes_only_in_random_order(tmp_path: Path) -> None:
    state = {"batch_size": 8, "world_size": 1}
    check_same_order(tmp_path, state, RANDOM, 8)
    with pytest.raises(TrainError, match="resume with --batch-order random"):
        check_same_order(tmp_path, state, GROUPED, 8)


def test_grouped_order_offline_is_refused(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--data", str(tmp_path), "--target", str(target), "--out", str(tmp_path / "o"), "--batch-order", "grouped"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--batch-order grouped goes with --online" in err and err.count("\n") == 1


def test_held_out_batches_come_shortest_first_with_every_held_out_chat_once(target: Path, tmp_path: Path) -> None:
    """Evaluation sums over the held-out chats, so their order is free: sorted, the target pads far less."""
    options = TrainOptions(
        data=Path(DEMO), target=target, out=tmp_path / "o", online=True, limit=96, val_samples=24, batch_size=4
    )
    run = prepare(options, distributed.init())
    source = run.source
    assert isinstance(source, OnlineSource)
    held = source.samples.lengths[source.first_val :]
    batches = list(source.val_batches(run.layout))
    widths = [batch.input_ids.shape[1] for batch in batches]
    assert widths == sorted(widths)
    assert sum(int(batch.attention_mask.sum()) for batch in batches) == sum(held)
    assert sum(int(batch.loss_mask.sum()) for batch in batches) == sum(
        int(source.samples.get(i)[1].sum()) for i in range(source.first_val, len(source.samples))
    )
    in_file_order = sum(4 * max(held[s : s + 4]) for s in range(0, len(held), 4))
    assert 4 * sum(widths) < 0.9 * in_file_order  # demo chats: 1,428 padded tokens against 1,760
