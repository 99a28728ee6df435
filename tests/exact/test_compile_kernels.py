"""The set-up's compiling step (python -m svattn.exact.compile_kernels) runs every compiled
operation without error."""

from svattn.exact import compile_kernels


def test_compile_kernels_runs_and_says_so(capsys):
    assert compile_kernels.main() == 0
    out = capsys.readouterr().out
    assert "compiled kernels are ready" in out


def test_read_only_inputs_compile_no_other_signature():
    """Frozen (read-only) keys and values reach the kernels as the one array type the
    set-up compiled: a read-only array would otherwise compile another signature of
    each kernel it reaches at its first use, inside the caller's timings."""
    import numpy as np
    from numba.core.registry import CPUDispatcher

    from svattn.exact import SVDDMemory
    from svattn.exact.backends import compiled
    from svattn.exact.backends.compiled import checks, columns, events, linalg, reserve, segments
    from svattn.exact.operations import validation

    def signatures() -> dict[str, int]:
        return {f"{m.__name__}.{k}": len(f.signatures)
                for m in (compiled, checks, columns, events, linalg, reserve, segments,
                          validation)
                for k, f in vars(m).items() if isinstance(f, CPUDispatcher)}

    rng = np.random.default_rng(0)
    x, v = rng.normal(size=(600, 6)), rng.normal(size=(600, 3))
    mem = SVDDMemory(0.05)
    mem.extend(x[:300], v[:300])  # writable: the signatures the set-up compiles
    for r in range(300, 320):
        mem.add(x[r], v[r])
    before = signatures()
    x.flags.writeable = v.flags.writeable = False
    mem.extend(x[320:500], v[320:500])
    for r in range(500, 560):
        mem.add(x[r], v[r])
    after = signatures()
    assert {k: n for k, n in after.items() if n != before.get(k, 0)} == {}
