"""Go's golang.org/x/mod/sumdb/{note,tlog} as an independent verifier of svattn's
checkpoints, notes and proofs: the Go program in tests/exact/tlogcheck/, built once.

Debian ships both (``apt-get install golang-go golang-golang-x-mod-dev``; .ci/run installs
them): the build is offline (GOPATH mode over /usr/share/gocode, no module proxy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

GOCODE = Path("/usr/share/gocode")
SOURCE = Path(__file__).parent / "exact" / "tlogcheck"
X_MOD = GOCODE / "src" / "golang.org" / "x" / "mod" / "sumdb"


def missing() -> str | None:
    """Why Go's verifier cannot be built here (None: it can)."""
    if shutil.which("go") is None:
        return "no `go` toolchain (apt-get install golang-go)"
    if not (X_MOD / "note").is_dir() or not (X_MOD / "tlog").is_dir():
        return f"no golang.org/x/mod source under {GOCODE} (apt-get install " \
               "golang-golang-x-mod-dev)"
    return None


def build(out_dir: Path) -> Path:
    """Build the verifier into ``out_dir``; return the binary."""
    binary = out_dir / "tlogcheck"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOCODE), "GOFLAGS": "",
           "GOPROXY": "off", "GOCACHE": str(out_dir / "gocache"), "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=SOURCE, env=env, check=True,
                   capture_output=True, timeout=300)
    return binary


class GoVerifier:
    """Runs the built binary on files it writes into a folder."""

    def __init__(self, binary: Path, work: Path) -> None:
        self.binary, self.work, self._n = binary, work, 0

    def _file(self, data: str | bytes) -> str:
        self._n += 1
        p = self.work / f"f{self._n}"
        p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        return str(p)

    def run(self, mode: str, vkey: str, *files: str | bytes) -> tuple[bool, str]:
        """``(accepted, output)`` of ``tlogcheck MODE VKEY FILES...``."""
        args = [str(self.binary), mode, self._file(vkey), *(self._file(f) for f in files)]
        res = subprocess.run(args, capture_output=True, text=True, timeout=60)
        if res.returncode not in (0, 1):
            raise RuntimeError(f"tlogcheck {mode}: usage error: {res.stdout}{res.stderr}")
        return res.returncode == 0, res.stdout.strip()


def sample_log(n: int, signer, origin: str = "svattn.audit/test"):
    """``(entries, tree, signed checkpoint note)`` of a log of ``n`` entries."""
    from svattn.exact.records.merkle import MerkleTree, leaf_hash
    from svattn.exact.records.tlog import Checkpoint

    entries = [b'{"op":"entry","seq":%d}' % i for i in range(n)]
    tree = MerkleTree([leaf_hash(e) for e in entries])
    return entries, tree, Checkpoint(origin, n, tree.root()).sign([signer])
