"""The set-up's warm-up step runs every compiled operation without error."""

from svattn.exact import warmup


def test_warmup_runs_and_says_so(capsys):
    assert warmup.main() == 0
    out = capsys.readouterr().out
    assert "compiled kernels are ready" in out
