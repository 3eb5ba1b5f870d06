#!/usr/bin/env python3
"""The keyword-debate task's items (data/keyword_debate/{train,eval}.jsonl), from the
story_keywords topics: each item gets four keywords drawn from a fixed list of concrete nouns
(a seeded draw per item, so the files are reproducible), as a list (`keywords`, which the reward
reads) and as text (`words`, which the prompts show). Run once: the files are part of the task.
"""
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOUNS = ["moon", "bread", "river", "clock", "garden", "candle", "bridge", "letter", "window", "forest",
         "mirror", "horse", "island", "basket", "tower", "violin", "shadow", "lamp", "apple", "storm",
         "key", "boat", "cloud", "stone"]


def main():
    for split, seed in [("train", 11), ("eval", 12)]:
        topics = [json.loads(l)["topic"] for l in open(ROOT / "data/story_keywords" / f"{split}.jsonl") if l.strip()]
        out = []
        for i, topic in enumerate(topics):
            words = random.Random(seed * 1000 + i).sample(NOUNS, 4)
            out.append(json.dumps({"topic": topic, "keywords": words,
                                   "words": ", ".join(words[:3]) + " and " + words[3]}))
        (ROOT / "data/keyword_debate" / f"{split}.jsonl").write_text("\n".join(out) + "\n")
        print(f"{split}: {len(out)} items")


if __name__ == "__main__":
    main()
