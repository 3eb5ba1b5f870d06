#!/usr/bin/env python3
"""CoMLRL's collected pairs (`comlrl_quickstart.py`'s DIR/pairs.json) as a pbrl round file, so that
pbrl trains on exactly the pairs CoMLRL trained on (like_for_like.sh's side `pbrloncomlrl`): the
difference between the two trained teams is then the training loop's, not the collection's.

The record format is the reference's (pbrl's `PreferencePair`); pbrl re-tokenizes the stored text,
as it does with its own rounds, so the script first checks that every completion's text encodes
back to the ids CoMLRL sampled (up to the end-of-turn) and reports the ones that do not. The
`winner_finished` / `loser_finished` flags (pbrl's own fields) say which completions ended with the
end-of-turn, from the sampled ids.

Usage: python experiments/comlrl/pairs_to_round.py PAIRS_JSON ROUND_JSON"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_comlrl import GGUF, GGUF_DIR  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def main(pairs_path, round_path):
    out = Path(round_path)
    if not (out.name.startswith("iteration_") and out.suffix == ".json" and out.stem[10:].isdigit()):
        sys.exit(f"{round_path}: a round file is named iteration_NNNN.json")
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF)
    stops = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    pairs = json.loads(Path(pairs_path).read_text())
    records, completions, other_ids, missing_mean = [], 0, 0, 0
    for i, p in enumerate(pairs):
        finished = {}
        for side in ("winner", "loser"):
            finished[side] = []
            for ids, text in zip(p[f"{side}_completion_ids"], p[f"{side}_completions"]):
                content = ids[: next((k for k, t in enumerate(ids) if t in stops), len(ids))]
                finished[side].append(len(content) < len(ids) and ids[len(content)] in stops)
                completions += 1
                if tok.encode(text, add_special_tokens=False) != content:
                    other_ids += 1
                    print(f"pair {i} {side}: the text encodes to other ids than the sampled ones", file=sys.stderr)
        if "candidate_reward_mean" not in p:
            # Dumps made before the field was added: pbrl only logs it (the
            # training's `reward_mean`), so the pair's own mean stands in, and says so.
            p["candidate_reward_mean"] = (p["winner_reward"] + p["loser_reward"]) / 2
            missing_mean += 1
        records.append({
            "prompts": p["prompts"], "winner_completions": p["winner_completions"],
            "loser_completions": p["loser_completions"], "winner_reward": p["winner_reward"],
            "loser_reward": p["loser_reward"], "candidate_reward_mean": p["candidate_reward_mean"],
            "winner_finished": finished["winner"], "loser_finished": finished["loser"]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"iteration": int(out.stem[10:]), "num_pairs": len(records), "pairs": records}))
    print(f"{len(records)} pairs -> {out}; {other_ids} of {completions} completions re-encode to other ids")
    if missing_mean:
        print(f"{missing_mean} pairs had no candidate_reward_mean: the pair's mean stands in (logged only)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
