"""The auditor's optimality proof (svattn.exact.auditor.optimality): the blocked pass
against the dense reference, a proof that can fail (edited alpha, mu or key), uniqueness
against the memory's own test, warm-up and the empty state, and C out of range."""

from __future__ import annotations

import json

import numpy as np
import pytest

from persist_helpers import make_memory
from svattn.exact import SVDDMemory
from svattn.exact.auditor.crosscheck import refuse_oracle
from svattn.exact.auditor.optimality import (
    blocked_gradient,
    check_optimality,
    dense_gradient,
    parameter_errors,
)
from svattn.exact.auditor.verify import verify_deletion, verify_erasure


def _prove(mem: SVDDMemory, **kw):
    return check_optimality(mem.keys, mem.alpha, mem.mu, mem.C, mem.kernel, mem.gamma_value,
                            warm=mem.warm, **kw)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("block_entries", [1, 97, 1 << 22])
def test_the_blocked_gradient_equals_the_dense_reference(kernel, block_entries):
    mem, _ = make_memory(300, kernel=kernel, values=True)
    args = (mem.keys, mem.alpha, mem.mu, mem.kernel, mem.gamma_value)
    g, size = blocked_gradient(*args, block_entries=block_entries)
    g_ref, size_ref = dense_gradient(*args)
    scale = np.maximum(size_ref, 1.0)
    assert np.max(np.abs(g - g_ref) / scale) <= 1e-14
    assert np.max(np.abs(size - size_ref) / scale) <= 1e-14


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_an_honest_state_is_proven_optimal_as_the_memory_says(kernel):
    mem, _ = make_memory(300, kernel=kernel)
    rep = _prove(mem, keep_g=True)
    assert rep.ok, rep.reasons
    assert rep.kkt_residual <= 1e-13 and rep.mu_rule == "margin"
    assert rep.unique == mem.unique_optimum()
    assert abs(rep.kkt_residual - mem.kkt_residual()) <= 1e-12


def _margin_pair(mem: SVDDMemory) -> tuple[int, int]:
    a = mem.alpha
    inside = np.flatnonzero((a > 0) & (a < mem.C))
    assert len(inside) >= 2
    return int(inside[0]), int(inside[1])


def test_moving_weight_between_two_margin_tokens_fails():
    mem, _ = make_memory(300)
    i, j = _margin_pair(mem)
    alpha = mem.alpha
    alpha[i] += 1e-6
    alpha[j] -= 1e-6  # still feasible: only the KKT conditions can tell
    rep = check_optimality(mem.keys, alpha, mem.mu, mem.C, mem.kernel, mem.gamma_value,
                           warm=False)
    assert not rep.ok and rep.kkt_residual >= 1e-8
    assert any(r.startswith("KKT residual") for r in rep.reasons)


def test_an_infeasible_alpha_fails():
    mem, _ = make_memory(300)
    alpha = mem.alpha
    alpha[_margin_pair(mem)[0]] += 1e-6  # sum(alpha) = 1 + 1e-6
    rep = check_optimality(mem.keys, alpha, mem.mu, mem.C, mem.kernel, mem.gamma_value,
                           warm=False)
    assert not rep.ok and any("not feasible" in r for r in rep.reasons)


def test_a_shifted_mu_fails():
    mem, _ = make_memory(300)
    rep = check_optimality(mem.keys, mem.alpha, mem.mu + 1e-6, mem.C, mem.kernel,
                           mem.gamma_value, warm=False)
    assert not rep.ok and rep.kkt_residual >= 1e-7


def test_an_edited_key_fails_although_the_memorys_caches_agree():
    """The proof recomputes K from the keys: a key edited behind the cache's back (the
    memory's own residual, read off its cached columns, still says optimal) fails."""
    mem, _ = make_memory(300)
    ss = mem.solver_state
    slot = ss.margin_slots()[0]
    ss.X[slot] += 0.05
    assert mem.kkt_residual() <= 1e-12  # the cache does not see it
    rep = _prove(mem)
    assert not rep.ok and rep.kkt_residual >= 1e-6


def test_an_edited_key_fails_verify_deletion(tmp_path):
    mem = SVDDMemory(0.05, audit_log=tmp_path / "a.jsonl")
    ids = mem.extend(np.random.default_rng(4).normal(size=(90, 3)))
    cert = mem.remove(ids[7])
    ss = mem.solver_state
    ss.X[ss.margin_slots()[0]] += 0.05
    v = verify_deletion(mem, cert, log=tmp_path / "a.jsonl")
    assert v.status == "FAILED"
    assert "exact optimum of the remaining tokens" in v.verdict.failed


def test_duplicate_keys_make_the_optimum_not_unique_as_the_memory_says():
    X = np.random.default_rng(2).normal(size=(60, 3))
    mem = SVDDMemory(0.05)
    mem.extend(X)
    mem.extend(mem.keys[[mem.ids.index(t) for t in mem.support_ids()[:3]]])
    rep = _prove(mem)
    assert rep.ok, rep.reasons  # still an optimum
    assert not rep.unique and not mem.unique_optimum()
    assert "equal keys" in rep.uniqueness or "not positive definite" in rep.uniqueness


@pytest.mark.parametrize("seed", range(6))
def test_uniqueness_agrees_with_the_memorys_own_test(seed):
    rng = np.random.default_rng(seed)
    mem = SVDDMemory(float(rng.choice([0.02, 0.05, 0.2])))
    X = rng.normal(size=(120, 3))
    mem.extend(np.concatenate([X, X[rng.integers(0, 120, seed)]]))  # 0..5 copies
    assert _prove(mem).unique == mem.unique_optimum()


def test_warm_up_is_the_uniform_convention():
    mem = SVDDMemory(0.05)
    mem.extend(np.random.default_rng(0).normal(size=(10, 3)))  # n·C = 0.5 < 1
    assert mem.warm
    rep = _prove(mem)
    assert rep.ok and rep.mu_rule == "warm-up"
    alpha = mem.alpha
    alpha[0] += 1e-9
    alpha[1] -= 1e-9
    bad = check_optimality(mem.keys, alpha, 0.0, mem.C, mem.kernel, mem.gamma_value, warm=True)
    assert not bad.ok
    assert not check_optimality(mem.keys, mem.alpha, 0.1, mem.C, mem.kernel, mem.gamma_value,
                                warm=True).ok


def test_an_empty_margin_set_takes_an_end_of_mus_interval():
    mem = SVDDMemory(0.25)  # at n = 4 every token is at C: no margin token
    mem.extend(np.random.default_rng(5).normal(size=(4, 2)))
    rep = _prove(mem)
    assert rep.ok and rep.mu_rule in ("largest", "smallest"), rep
    moved = check_optimality(mem.keys, mem.alpha, mem.mu - 0.1, mem.C, mem.kernel,
                             mem.gamma_value, warm=False)
    assert not moved.ok and moved.mu_rule == "none"


def test_the_certificate_of_removing_the_last_token_verifies(tmp_path):
    """Before: with no token left nothing could check the exact-optimum claim (always
    UNCHECKED, exit 3). The retrain of no tokens is the empty state (mu = 0)."""
    from svattn.cli import main
    from svattn.exact.records.signing import write_keypair

    log, state = tmp_path / "a.jsonl", tmp_path / "m.safetensors"
    key, pub = write_keypair(tmp_path / "controller")
    mem = SVDDMemory(0.5, audit_log=log, signing_key=key)
    (only,) = mem.extend(np.ones((1, 2)))
    cert = mem.remove(only)
    v = verify_deletion(mem, cert, log=log, public_key=pub)
    assert v.status == "VERIFIED", (v.reasons, v.verdict.unchecked)
    assert v.optimality.mu_rule == "empty"
    mem.save(state)
    (tmp_path / "c.json").write_text(cert.to_json())
    # signed log and receipt, the controller's key given: every field and the log checked
    assert main(["verify-deletion", str(state), str(tmp_path / "c.json"), "--log", str(log),
                 "--public-key", str(pub)]) == 0


def test_an_emptied_memory_with_a_stray_mu_fails(tmp_path):
    mem = SVDDMemory(0.5, audit_log=tmp_path / "a.jsonl")
    (only,) = mem.extend(np.ones((1, 2)))
    cert = mem.remove(only)
    mem.solver_state.mu = 0.5
    assert not check_optimality(np.zeros((0, 2)), np.zeros(0), 0.5, 0.5, "rbf", 0.5,
                                warm=False).ok
    assert not verify_deletion(mem, cert, log=tmp_path / "a.jsonl").ok


@pytest.mark.parametrize(("C", "n", "warm", "words"), [
    (0.0, 5, True, "must be > 0"), (-1.0, 5, True, "must be > 0"),
    (1.5, 5, False, "above 1"), (1e-300, 4, True, "below 2**-53"),
    (float("nan"), 5, False, "not a finite"), (10**400, 5, False, "not a finite"),
    (0.01, 50, False, "no feasible point"),
])
def test_a_C_no_memory_holds_is_named(C, n, warm, words):
    (reason,) = parameter_errors(C, n, warm)
    assert reason.startswith("C:") and words in reason


def test_sane_parameters_pass():
    assert parameter_errors(0.05, 10, True) == []  # warm-up
    assert parameter_errors(1 / 3, 3, False) == []  # n·C rounds below 1: feasible
    assert parameter_errors(1.0, 1, False) == []


def test_verify_deletion_refuses_a_solved_state_with_n_C_below_one():
    mem = SVDDMemory(0.2)
    ids = mem.extend(np.random.default_rng(1).normal(size=(20, 3)))
    cert = mem.remove(ids[0])
    mem.solver_state.C = 0.01  # crafted: 19 tokens cannot be solved at C = 0.01
    with pytest.raises(ValueError, match="no feasible point"):
        verify_deletion(mem, cert)


def _crafted_state(tmp_path, C):
    """A saved state whose metadata names ``C`` (its checksum recomputed: it is unkeyed)."""
    from safetensors.numpy import safe_open

    from svattn.exact.records.fileformat import serialize

    mem = SVDDMemory(0.5)
    ids = mem.extend(np.random.default_rng(0).normal(size=(5, 3)))
    cert = mem.remove(ids[0])
    mem.save(tmp_path / "m.safetensors")
    with safe_open(str(tmp_path / "m.safetensors"), "numpy") as fh:
        meta = json.loads(fh.metadata()["svattn"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    meta["C"] = C
    from svattn.exact.records.fileformat import canonical, sha256_hex

    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    meta["meta_sha256"] = sha256_hex(canonical(body).encode())
    (tmp_path / "x.safetensors").write_bytes(serialize(tensors, meta))
    (tmp_path / "c.json").write_text(cert.to_json())
    return tmp_path / "x.safetensors", tmp_path / "c.json"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("C", [1e-300, 0.0, -0.5, 2.0])
@pytest.mark.parametrize("command", ["verify-deletion", "verify-erasure"])
def test_a_crafted_state_with_C_out_of_range_exits_2_at_once(tmp_path, capsys, C, command):
    """Before: C = 1e-300 stalled the load (the warm-up threshold's loop, ~1e-12/C steps)."""
    from svattn.cli import main

    state, cert = _crafted_state(tmp_path, C)
    assert main([command, str(state), str(cert)]) == 2
    err = capsys.readouterr().err
    assert "malformed state" in err and "C:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_oracle_is_refused_above_what_it_can_afford(monkeypatch):
    import svattn.exact.auditor.crosscheck as crosscheck

    refuse_oracle(crosscheck.ORACLE_MAX_TOKENS, False)  # at the bound: runs
    with pytest.raises(ValueError, match="oracle_force"):
        refuse_oracle(crosscheck.ORACLE_MAX_TOKENS + 1, False)
    refuse_oracle(crosscheck.ORACLE_MAX_TOKENS + 1, True)
    monkeypatch.setattr(crosscheck, "ORACLE_MAX_TOKENS", 10)
    mem = SVDDMemory(0.2)
    ids = mem.extend(np.random.default_rng(1).normal(size=(30, 3)))
    cert = mem.remove(ids[0])
    with pytest.raises(ValueError, match="refused above 10 tokens"):
        verify_deletion(mem, cert, oracle=True)
    assert verify_deletion(mem, cert, oracle=True, oracle_force=True).retrained
    assert verify_deletion(mem, cert).ok  # the default never runs it


def test_progress_reaches_every_token():
    mem, _ = make_memory(300)
    calls = []
    _prove(mem, block_entries=500, progress=lambda s, d, t: calls.append((s, d, t)))
    kkt = [c for c in calls if c[0] == "KKT"]
    assert len(kkt) > 1 and kkt[-1] == ("KKT", len(mem), len(mem))
    assert [d for _, d, _ in kkt] == sorted(d for _, d, _ in kkt)


def test_an_erasure_reports_progress_over_its_certificates():
    mem = SVDDMemory(0.05, tag_key=b"k" * 32)
    mem.extend(np.random.default_rng(3).normal(size=(80, 3)), tags=["a", "b"] * 40)
    receipt = mem.erase("a")
    calls = []
    assert verify_erasure(mem, receipt, progress=lambda *c: calls.append(c)).ok
    certs = [c for c in calls if c[0] == "certificates"]
    assert certs[-1] == ("certificates", 40, 40) and len(certs) == 40
    assert any(c[0] == "KKT" for c in calls)


def test_the_cli_prints_progress_after_two_seconds(capsys):
    from svattn.exact.auditor.progress import StderrProgress

    clock = iter([0.0, 0.5, 2.5, 2.6, 4.0])
    p = StderrProgress()
    p._clock = lambda: next(clock)
    for done in (0, 100, 5200, 5300, 13000):
        p("KKT", done, 13000)
    err = capsys.readouterr().err.splitlines()
    assert err == ["checking KKT: 40 % (5,200 of 13,000 tokens)",
                   "checking KKT: 100 % (13,000 of 13,000 tokens)"]


def test_the_verdict_says_the_optimality_check_binds_the_kkt_residual(tmp_path):
    """Before: kkt_residual_after was listed as checked by the state, which only compared
    it with the memory's own residual."""
    log = tmp_path / "a.jsonl"
    mem = SVDDMemory(0.05, audit_log=log)
    ids = mem.extend(np.random.default_rng(3).normal(size=(80, 3)))
    cert = mem.remove(ids[5])
    v = verify_deletion(mem, cert)
    assert "optimality" in v.verdict.ran and "kkt_residual_after" in v.verdict.checked
    quick = verify_deletion(mem, cert, retrain=False)  # no proof: the residual unchecked
    assert "kkt_residual_after" in dict(quick.verdict.unchecked)
    erased = SVDDMemory(0.05, tag_key=b"k" * 32)
    erased.extend(np.random.default_rng(3).normal(size=(80, 3)), tags=["a", "b"] * 40)
    e = verify_erasure(erased, erased.erase("a"))
    assert "optimality" in e.verdict.ran
    assert "exact optimum of the remaining tokens" in e.verdict.checked


@pytest.mark.parametrize("command", [["verify-deletion"], ["verify-erasure"],
                                     ["audit", "verify"]])
def test_every_verifier_lists_its_exit_statuses(command, capsys):
    from svattn.cli import main

    with pytest.raises(SystemExit):
        main([*command[:1], "--help"])
    out = capsys.readouterr().out
    for line in ("0  VERIFIED", "1  FAILED", "2  malformed input", "3  UNCHECKED"):
        assert line in out, (command, out)
