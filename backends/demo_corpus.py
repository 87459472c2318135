"""The built-in demo corpus: a few hundred short chats written for this project.

Used by `make demo` and the tests (`--data demo`), so that extraction and
training run with no download. Each chat is built from a hand-written topic
(a question template, its matching answer template and a few slot values),
with an optional system prompt and an optional follow-up turn. The chats are
deliberately regular (a small vocabulary, repeated phrasing): the demo target is
random, so what a draft learns is the target's own next-token function, and it
learns it visibly only when the same tokens come back often.

`python -m backends.demo_corpus --out FILE.jsonl` writes the corpus in the
`{"messages": [...]}` JSONL form that `backends.extract --data` reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

Message = dict[str, str]
Chat = dict[str, list[Message]]

DEMO_SIZE = 400
DEMO_SEED = 0


@dataclass(frozen=True)
class Topic:
    """Question and answer templates over shared `{slot}` values; answers[i] answers questions[i]."""

    questions: tuple[str, ...]
    answers: tuple[str, ...]
    slots: dict[str, tuple[str, ...]]
    follow_up: tuple[str, str]
    # A slot whose value follows another slot's (same index), so that answers stay true.
    tied: tuple[tuple[str, str], ...] = ()


TOPICS: tuple[Topic, ...] = (
    Topic(
        questions=(
            "How much memory does the {gpu} have?",
            "Is the {gpu} a good choice for {task}?",
            "Why is my {gpu} slow at {task}?",
        ),
        answers=(
            "The {gpu} has {mem} of memory. That is enough for {task} with a modest batch size.",
            "Yes, the {gpu} works well for {task}. Watch the memory use and keep the batch small at first.",
            "Check that the {gpu} is not sharing work with another job. For {task}, use bf16 and a larger batch.",
        ),
        slots={
            "gpu": ("H200", "H100", "A100", "L40S", "RTX 4090", "A10G"),
            "mem": ("141 GB", "80 GB", "80 GB", "48 GB", "24 GB", "24 GB"),
            "task": ("training", "inference", "fine-tuning", "serving a chat model", "extracting hidden states"),
        },
        follow_up=("And what about power use?", "Power use depends on the load. Under full load the card runs hot."),
        tied=(("mem", "gpu"),),
    ),
    Topic(
        questions=(
            "What learning rate should I use for {model}?",
            "My loss is stuck at {loss} while training {model}. What should I try?",
            "How many epochs does {model} need?",
        ),
        answers=(
            "Start {model} with a learning rate of {lr} and a short warmup. Lower it if the loss jumps.",
            "A loss stuck at {loss} often means the learning rate is too high. Try {lr} and check the data.",
            "Two or three epochs are usually enough for {model}. More data helps more than more epochs.",
        ),
        slots={
            "model": ("a small draft model", "a tiny transformer", "a speculative decoder", "a chat model"),
            "lr": ("1e-4", "3e-4", "5e-5", "2e-4"),
            "loss": ("5.4", "6.1", "4.2", "3.9"),
        },
        follow_up=("Should I use a scheduler?", "Yes. A cosine schedule with a short warmup is a safe default."),
    ),
    Topic(
        questions=(
            "How long should I boil {food}?",
            "Can I cook {food} in the oven?",
            "What goes well with {food}?",
        ),
        answers=(
            "Boil {food} for about {minutes} minutes, then drain and serve.",
            "Yes, you can cook {food} in the oven at 200 degrees for about {minutes} minutes.",
            "{food} goes well with {side}. Add a little salt and some fresh herbs.",
        ),
        slots={
            "food": ("pasta", "rice", "potatoes", "eggs", "carrots", "lentils", "broccoli"),
            "minutes": ("10", "12", "15", "20", "25"),
            "side": ("a green salad", "roasted garlic", "lemon and butter", "fresh bread", "a tomato sauce"),
        },
        follow_up=("Any tip for seasoning?", "Taste as you go and add salt in small steps."),
    ),
    Topic(
        questions=(
            "What is the best time to visit {city}?",
            "How do I get around in {city}?",
            "What should I pack for a trip to {city}?",
        ),
        answers=(
            "The best time to visit {city} is in {season}, when the weather is mild and the crowds are small.",
            "In {city} the easiest way to get around is by {transport}. Buy a day pass to save money.",
            "For {city} in {season}, pack light layers, good shoes and a small umbrella.",
        ),
        slots={
            "city": ("Lisbon", "Kyoto", "Vienna", "Montreal", "Cape Town", "Oslo", "Mexico City"),
            "season": ("spring", "autumn", "early summer", "late winter"),
            "transport": ("tram", "train", "bus", "bicycle", "metro"),
        },
        follow_up=("Is it expensive?", "It can be. Plan your budget and book early for better prices."),
    ),
    Topic(
        questions=(
            "How often should I water my {plant}?",
            "Why are the leaves of my {plant} turning yellow?",
            "Where should I put my {plant}?",
        ),
        answers=(
            "Water your {plant} about once every {days} days, and let the soil dry between waterings.",
            "Yellow leaves on a {plant} usually mean too much water. Let the soil dry and check the pot drains.",
            "Put your {plant} near a window with {light}. Turn the pot every week so it grows evenly.",
        ),
        slots={
            "plant": ("basil", "cactus", "fern", "tomato plant", "orchid", "snake plant"),
            "days": ("three", "five", "seven", "ten"),
            "light": ("bright indirect light", "morning sun", "soft light"),
        },
        follow_up=("Does it need fertilizer?", "A little, once a month in spring and summer, is enough."),
    ),
    Topic(
        questions=(
            "How do I read a file line by line in {language}?",
            "What is a good first project in {language}?",
            "How do I handle errors in {language}?",
        ),
        answers=(
            "In {language}, open the file and loop over it, reading one line at a time. Close it when you are done.",
            "A good first project in {language} is {project}. It is small, and you will learn the basics fast.",
            "In {language}, catch the errors you expect, report them clearly, and let the rest fail loudly.",
        ),
        slots={
            "language": ("Python", "Rust", "Go", "C", "JavaScript"),
            "project": ("a to-do list", "a small web server", "a word counter", "a unit converter"),
        },
        follow_up=("Any book you recommend?", "Start with the official tutorial. It is short and up to date."),
    ),
    Topic(
        questions=(
            "How do I start running if I am a beginner?",
            "How far should I {activity} in my first week?",
            "Is it fine to {activity} every day?",
        ),
        answers=(
            "Start with short runs of {minutes} minutes, three times a week, and walk when you need to.",
            "In your first week, {activity} for about {minutes} minutes at a time and rest between days.",
            "You can {activity} every day if you keep it easy. Take a rest day when you feel tired.",
        ),
        slots={
            "activity": ("run", "swim", "cycle", "walk"),
            "minutes": ("10", "15", "20", "30"),
        },
        follow_up=("What about stretching?", "Stretch gently after you finish, not before."),
    ),
    Topic(
        questions=(
            "What is speculative decoding?",
            "Why does a draft model need the hidden states of the {target}?",
            "What acceptance length should I expect from a draft for the {target}?",
        ),
        answers=(
            "Speculative decoding lets a small draft model guess a few tokens, and the {target} checks them at once.",
            "The draft reads the hidden states of the {target} so that its guesses follow what the {target} would say.",
            "A good draft for the {target} reaches an acceptance length of about {length} tokens per step.",
        ),
        slots={
            "target": ("target model", "large model", "base model"),
            "length": ("two", "three", "three and a half", "four"),
        },
        follow_up=("Does it change the output?", "No. The target checks every token, so the output is the same."),
    ),
    Topic(
        questions=(
            "Can you recommend a {genre} song?",
            "How do I learn to play the {instrument}?",
            "How long does it take to learn the {instrument}?",
        ),
        answers=(
            "For {genre}, try a slow song with a clear melody. Listen to it a few times before you judge it.",
            "To learn the {instrument}, practise for {minutes} minutes every day and start with simple songs.",
            "Most people play simple songs on the {instrument} after a few months of steady practice.",
        ),
        slots={
            "genre": ("jazz", "folk", "classical", "blues", "pop"),
            "instrument": ("guitar", "piano", "violin", "drums", "flute"),
            "minutes": ("15", "20", "30"),
        },
        follow_up=("Should I take lessons?", "A few lessons help you avoid bad habits early."),
    ),
    Topic(
        questions=(
            "What does a {role} do on a training cluster?",
            "How do I share {resource} between jobs?",
            "How do I know if a job is stuck?",
        ),
        answers=(
            "A {role} keeps the cluster healthy. They watch the jobs, the GPUs and the {resource}.",
            "Share {resource} by giving each job a fixed slice, and free it as soon as the job ends.",
            "A stuck job prints nothing new and its GPU use drops. Check the log and the {resource} first.",
        ),
        slots={
            "role": ("system admin", "research engineer", "platform engineer"),
            "resource": ("GPU memory", "disk space", "network bandwidth", "CPU cores"),
        },
        follow_up=("Can it be automated?", "Yes. A small watchdog script can alert you when a job goes quiet."),
    ),
)

SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a helpful assistant. Answer briefly.")


def _fill(template: str, values: dict[str, str]) -> str:
    text = template.format(**values)
    return text[0].upper() + text[1:]


def _chats_of(topic: Topic, rng: random.Random) -> list[Chat]:
    """Every (question, slot values) combination of one topic, as one-turn chats, shuffled."""
    tied = dict(topic.tied)
    free = [name for name in topic.slots if name not in tied]
    chats: list[Chat] = []
    for question, answer in zip(topic.questions, topic.answers, strict=True):
        text = question + answer
        used = {name for name in free if "{" + name + "}" in text}
        used |= {leader for name, leader in tied.items() if "{" + name + "}" in text}
        ranges = [range(len(topic.slots[name])) if name in used else range(1) for name in free]
        for combo in itertools.product(*ranges):
            picked = dict(zip(free, combo, strict=True))
            picked |= {name: picked[leader] for name, leader in tied.items()}
            values = {name: topic.slots[name][i] for name, i in picked.items()}
            user = {"role": "user", "content": _fill(question, values)}
            chats.append({"messages": [user, {"role": "assistant", "content": _fill(answer, values)}]})
    rng.shuffle(chats)
    return chats


def demo_chats(size: int = DEMO_SIZE, seed: int = DEMO_SEED) -> list[Chat]:
    """`size` distinct chats, the same list for the same seed, topics interleaved."""
    rng = random.Random(seed)
    pools = [_chats_of(topic, rng) for topic in TOPICS]
    chats: list[Chat] = []
    for round_ in itertools.count():
        if len(chats) >= size or all(round_ >= len(pool) for pool in pools):
            break
        for topic, pool in zip(TOPICS, pools, strict=True):
            if round_ < len(pool) and len(chats) < size:
                chats.append(_decorate(pool[round_]["messages"], topic, rng))
    return chats


def _decorate(messages: list[Message], topic: Topic, rng: random.Random) -> Chat:
    """Add a system prompt to about a third of the chats and a follow-up turn to about a quarter."""
    out = list(messages)
    if rng.random() < 0.25:
        question, answer = topic.follow_up
        out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if rng.random() < 0.35:
        out.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return {"messages": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.demo_corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--size", type=int, default=DEMO_SIZE)
    args = parser.parse_args(argv)
    chats = demo_chats(args.size)
    with open(args.out, "w", encoding="utf-8") as fh:
        for chat in chats:
            fh.write(json.dumps(chat) + "\n")
    print(f"wrote {len(chats)} chats to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
