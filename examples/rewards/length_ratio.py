#!/usr/bin/env python3
"""A pbrl reward program: the reference quick-start length-ratio reward, as an external command.

pbrl starts this once per run (`[reward] kind = "command"`, `command = ["python3", "examples/rewards/length_ratio.py"]`)
and talks to it in JSON lines. Each request line holds one entry per joint response:

  {"prompts": [[agent prompts], ...], "completions": [[agent 0 texts], [agent 1 texts], ...], "items": [task item, ...]}

and the program answers with one line, one reward per joint response:

  {"rewards": [1.0, 0.37, ...]}

Anything written to stderr is shown by pbrl if the program fails. Keep stdout for answers only.
"""
import json
import math
import sys

TARGET_MIN, TARGET_MAX = 2.0, 3.0


def length_ratio(first: str, second: str) -> float:
    if len(first) == 0:
        return 0.0
    ratio = len(second) / len(first)
    if ratio < TARGET_MIN:
        return math.exp(-(TARGET_MIN - ratio))
    if ratio > TARGET_MAX:
        return math.exp(-(ratio - TARGET_MAX))
    return 1.0


for line in sys.stdin:
    request = json.loads(line)
    brief, detailed = request["completions"][0], request["completions"][1]
    rewards = [length_ratio(a, b) for a, b in zip(brief, detailed)]
    print(json.dumps({"rewards": rewards}), flush=True)
