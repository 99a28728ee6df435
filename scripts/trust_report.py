"""Write ``results/trust/README.md`` from the trust benchmarks' own JSON records.

Reads ``fuzz_campaign.json``, ``tamper_matrix.json`` and ``erase_cost.json`` (each
written by its benchmark, with the command that produced it) and writes one page of
tables; nothing in it is typed by hand.

Usage::

    python scripts/trust_report.py [--dir results/trust]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def fuzz_section(r: dict) -> list[str]:
    k = r["killed_saves"]
    return [
        "## Fuzz campaign against an independent reference", "",
        f"`{r['command']}` ({r['seconds']} s)", "",
        "| measured | value |", "|---|---|",
        f"| operations (add / extend / remove / erase / compact) | {r['operations']} "
        f"({', '.join(f'{n} {op}' for op, n in sorted(r['ops'].items()))}) |",
        f"| streams by kind | {', '.join(f'{k_} {n}' for k_, n in r['streams'].items())} |",
        f"| states saved and loaded back, digest equal | {r['save_load_ok']} of "
        f"{r['operations']} ({len(r['save_load_failed'])} failed) |",
        f"| alpha compared with the reference (exactness claimed, reference solved) | "
        f"{r['compared']} ({r['reference_inconclusive']} inconclusive: the reference's own "
        "KKT violation above 1e-10) |",
        f"| max \\|Δα\\| (shifted by 1e4 / other streams) | {r['max_alpha_dev_shifted']:.1e} / "
        f"{r['max_alpha_dev_other']:.1e} |",
        f"| max KKT violation on the reference's own Gram matrix | "
        f"{r['max_kkt_on_reference_gram']:.1e} |",
        f"| max KKT residual (the memory's measure, all states) | {r['max_kkt']:.1e} |",
        f"| states above tol, not claimed exact | {r['above_tol_not_claimed']} |",
        f"| injected faults survived (memory, log unchanged) | {r['faults_survived']} of "
        f"{r['faults_injected']} ({r['faults_not_reached']} drawn past the operation's "
        "last call) |",
        f"| saves killed by SIGKILL: state loads afterwards | {k['loaded_after_kill']} of "
        f"{k['trials']} |",
        f"| temporary files left by the kills / after the next save | "
        f"{k['leftovers_after_kill']} / {k['leftovers_after_next_save']} |",
        f"| erased keys' bytes found under the directory or in the log | "
        f"{k['erased_bytes_found']} |", ""]


def tamper_section(r: dict) -> list[str]:
    rows = ["## Tamper matrix", "", f"`{r['command']}`", "",
            "Every field of every receipt type, enumerated from its declaration, edited; "
            "per setting: FAILED, or reported unchecked (the verdict names the field and "
            "what would check it). VERIFIED or a field claimed checked would be a lie.", ""]
    for kind, fields in r["receipt_fields"].items():
        settings = list(next(iter(fields.values())))
        rows += [f"| {kind} field edited | " + " | ".join(settings) + " |",
                 "|---|" + "---|" * len(settings)]
        for field, row in fields.items():
            rows.append(f"| {field} | " + " | ".join(_outcome(c) for c in row.values()) + " |")
        rows.append("")
    rows += ["| edit | detected / tried |", "|---|---|"]
    return rows + _tamper_rest(r)


def _outcome(counts: dict) -> str:
    if counts["VERIFIED"] or counts["claimed checked"]:
        return "**VERIFIED**"
    return "FAILED" if not counts["unchecked"] else (
        "reported unchecked" if not counts["failed"] else "FAILED / reported unchecked")


def _tamper_rest(r: dict) -> list[str]:
    rows = []
    rb, sb = r["receipt_bytes_with_public_key"], r["state_file_bytes"]
    rows.append(f"| receipt bytes replaced (public key) | {rb['detected']} / {rb['tried']} |")
    rows.append(f"| state file bytes replaced | {sb['detected']} / {sb['tried']} |")
    keyed = all("failed_with_key" in row for row in r["log_records"].values())
    if not keyed:  # a record from before the log's checkpoints
        for name, row in r["log_records"].items():
            rows.append(f"| log records {name.replace('_', ' ')} | {row['detected']} / "
                        f"{row['tried']} |")
    else:
        rows += ["", "The audit log tampered with (each record in turn): caught by the hash "
                 "chain alone; refused by the log's checkpoint with the controller's key but "
                 "no state (`svattn audit verify LOG --public-key`, exit 1); with the state: "
                 "caught by the chain and the state, refused with the key (`svattn audit "
                 "verify LOG STATE --public-key`: the checkpoints and their signatures, exit "
                 "1), never verified without the key (exit 1 or 3).", "",
                 "| log | tried | chain alone | checkpoint + key | chain + state | state + "
                 "key | not verified without the key |", "|---|---|---|---|---|---|---|"]
        for name, row in r["log_records"].items():
            rows.append(f"| {name.replace('_', ' ')} | {row['tried']} | "
                        f"{row.get('chain_alone', '')} | "
                        f"{row.get('failed_with_key_without_state', '')} | {row['detected']} | "
                        f"{row['failed_with_key']} | {row['not_verified_without_key']} |")
    if "tlog_proofs" in r:
        rows += ["", "Each receipt type's `.tlog-proof` (`svattn audit prove LOG --receipt "
                 "R`), accepted as made; its mutants (every byte of the entry, every hash of "
                 "the path with a bit flipped, a hash removed or repeated, the index ±1, the "
                 "checkpoint signed by another key) refused by `verify_proof`:", "",
                 "| receipt | entry index | entry bytes | path hashes | mutants refused |",
                 "|---|---|---|---|---|"]
        for kind, row in r["tlog_proofs"].items():
            rows.append(f"| {kind} | {row['index']} | {row['entry_bytes']} | "
                        f"{row['path_hashes']} | {row['detected']} / {row['tried']} |")
    rows += ["", "Costs (µs): " + ", ".join(f"{k} {v:.0f}" for k, v in r["costs"].items()), ""]
    return rows


def erase_section(r: dict) -> list[str]:
    e, a = r["erase"], r["atomic"]
    m = e["median_ms"]
    return [
        "## Costs of erasure and atomicity", "", f"`{r['command']}`", "",
        f"ICU stream ({e['data']}, n = {e['n']}, C = {e['C']}), {e['stays']} stays of median "
        f"{e['tokens_per_stay_median']:.0f} tokens, medians:", "",
        "| erase(stay), one receipt | its tokens removed one by one | ratio | sign the receipt "
        "| check its signature | verify_erasure (no retrain) |", "|---|---|---|---|---|---|",
        f"| {m['erase_ms']:.1f} ms | {m['one_by_one_ms']:.1f} ms | "
        f"{e['erase_over_one_by_one']:.2f}× | {m['sign_ms']:.2f} ms | "
        f"{m['check_signature_ms']:.2f} ms | {m['verify_erasure_ms']:.1f} ms |", "",
        f"Atomicity: one checkpoint costs {a['checkpoint_ms']:.3f} ms per operation at "
        f"n = {a['n']}, d = {a['d']}: {a['checkpoint_over_remove']:.2f}× the median removal "
        f"({a['remove_ms']:.3f} ms) and {a['checkpoint_over_add']:.2f}× the median add "
        f"({a['add_ms']:.3f} ms).", ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path("results/trust"))
    args = p.parse_args(argv)
    lines = ["# Deletion an auditor can trust: measurements", "",
             "Written by `python scripts/trust_report.py` from the JSON records beside it; "
             "each section names the command that produced its numbers.", ""]
    for name, section in (("fuzz_campaign.json", fuzz_section),
                          ("tamper_matrix.json", tamper_section),
                          ("erase_cost.json", erase_section)):
        record = _load(args.dir, name)
        lines += section(record) if record else [f"({name} not measured yet)", ""]
    (args.dir / "README.md").write_text("\n".join(lines))
    print(f"wrote {args.dir / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
