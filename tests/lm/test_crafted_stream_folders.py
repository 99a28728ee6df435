"""What ``LMStream.load`` and ``save`` refuse in a stream folder crafted with its
checksums and digest recomputed, and what they never follow: a manifest without its
digest, naming files outside the folder or an edited model config; held text with a
byte outside the vocabulary; a memory file of other dimensions or another C; a symlink
planted as the lock file or as a state file; a signing key other than the folder's
signer's (a saved signing stream keeps signing). Comments say what each case did
before it was refused; "(held)" marks the ones refused from the start.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from stream_helpers import cell_model, text_of
from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.lm.forget import verify_forget
from svattn.lm.stream import LMStream, StreamStateError
from svattn.lm.stream_folder import write_manifest


# stream.json without its "digest", the checksum recomputed: KeyError traceback
def test_a_manifest_without_its_digest_is_refused(forgot, tmp_path):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man.pop("digest")
    write_manifest(copy, man)
    with pytest.raises(StreamStateError, match="digest"):
        LMStream.load(copy, model)


# (held) stream.json naming state files in another folder (a relative path, an
# absolute one), its checksum recomputed: refused before anything is read or removed
@pytest.mark.parametrize("name", ["../other/arrays.0123456789ab.safetensors",
                                  "/tmp/arrays.0123456789ab.safetensors",
                                  "arrays.0123456789ab.safetensors/../../x"])
def test_a_manifest_naming_files_elsewhere_is_refused(forgot, tmp_path, name):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man["arrays"]["file"] = name
    write_manifest(copy, man)
    with pytest.raises(StreamStateError):
        LMStream.load(copy, model)


# the manifest's model_config edited (any value: a string for C, a huge
# vocab_size), the checksum recomputed: load never read it, so the folder loaded and
# verify-forget said VERIFIED beside a config that names another model
@pytest.mark.parametrize("edit", [("vocab_size", 2**63), ("dropout", [1, 2]), ("rope", None)])
def test_a_manifest_with_an_edited_model_config_is_refused(forgot, tmp_path, edit):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man["model_config"][edit[0]] = edit[1]
    write_manifest(copy, man)
    with pytest.raises(StreamStateError, match="model_config"):
        LMStream.load(copy, model)


# a stream folder whose held text has a byte outside the model's vocabulary
# (the arrays file, its SHA-256, the digest and the checksum recomputed): load took
# it, then forget failed midway with IndexError and left the stream unusable
def test_a_folder_holding_a_byte_outside_the_vocabulary_is_refused(forgot, tmp_path):
    import hashlib

    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    path = copy / man["arrays"]["file"]
    arr = st_load(path.read_bytes())
    arr["tokens"][3] = 200
    data = st_save(arr)
    path.write_bytes(data)
    man["arrays"]["sha256"] = hashlib.sha256(data).hexdigest()
    honest = LMStream.load(folder, model)
    honest._tokens[3] = 200
    man["digest"] = honest.digest()  # what the crafted state digests to
    write_manifest(copy, man)
    with pytest.raises(StreamStateError, match="vocabulary"):
        LMStream.load(copy, model)


def _swap_memory(folder: Path, copy: Path, stream: LMStream, fake: SVDDMemory) -> None:
    """``folder`` copied to ``copy`` with layer 0 head 0's memory file replaced by
    ``fake`` (its SHA-256, the digest and the checksum recomputed)."""
    import hashlib

    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    entry = man["layers"][0]["memories"][0]
    (copy / entry["file"]).unlink()
    fake.save(copy / entry["file"])
    entry["sha256"] = hashlib.sha256((copy / entry["file"]).read_bytes()).hexdigest()
    man["digest"] = stream.digest()  # the content digest counts tokens, not their data
    write_manifest(copy, man)


def _fake_memory(mem: SVDDMemory, *, C: float, d: int) -> SVDDMemory:
    rng = np.random.default_rng(0)
    fake = SVDDMemory(C=C, kernel=mem.kernel, gamma=mem.gamma_value)
    n = max(mem.ids) + 1
    fake.extend(rng.normal(size=(n, d)), rng.normal(size=(n, mem.values.shape[1])))
    for t in sorted(set(range(n)) - set(mem.ids)):
        fake.remove(t)
    return fake


# a stream folder whose memory file is another memory with the same token ids
# but keys of another dimension (or another C), its SHA-256 and the digest recomputed:
# load took it; forget then failed midway (ValueError: keys must have dimension 9),
# leaving the stream unusable, and verify_forget raised instead of saying FAILED
@pytest.mark.parametrize("edit", ["dimension", "C"])
def test_a_folder_with_a_memory_of_other_dimensions_is_refused(forgot, tmp_path, edit):
    model, folder, _ = forgot
    honest = LMStream.load(folder, model)
    mem = honest.layers[0].mems[0]
    fake = _fake_memory(mem, C=mem.C if edit == "dimension" else 0.5,
                        d=mem.dim + (1 if edit == "dimension" else 0))
    _swap_memory(folder, tmp_path / "st", honest, fake)
    with pytest.raises(StreamStateError, match="layer 0 head 0"):
        LMStream.load(tmp_path / "st", model)


# a symlink planted as the folder's stream.lock: save raised a bare OSError
# (ELOOP; a traceback from svattn generate --save), now a StreamStateError (exit 2);
# the symlink's target is never written
def test_a_symlinked_lock_file_is_refused_by_save(forgot, tmp_path, capsys):
    model = forgot[0]
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    folder = tmp_path / "st"
    folder.mkdir()
    (folder / "stream.lock").symlink_to(target)
    s = model.stream()
    s.feed(text_of(20))
    with pytest.raises(StreamStateError, match="stream.lock"):
        s.save(folder)
    assert target.read_bytes() == b"keep"
    path = cell_model(tmp_path / "cell.safetensors", model)
    assert main(["generate", str(path), "--prompt", "abcdefghijkl", "-n", "2", "--forget",
                 "2:6", "--save", str(folder)]) == 2
    assert "stream.lock" in capsys.readouterr().err


# (held) a state file of the folder replaced by a symlink to a file elsewhere
# holding the same bytes, then a save: the symlink is unlinked, its target untouched
def test_a_symlinked_state_file_is_unlinked_not_followed(forgot, tmp_path):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    name = man["arrays"]["file"]
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((copy / name).read_bytes())
    (copy / name).unlink()
    (copy / name).symlink_to(outside)
    s = LMStream.load(copy, model)  # same bytes: the checksum holds
    before = outside.read_bytes()
    s.save(copy)
    assert outside.read_bytes() == before and not (copy / name).exists()


# a signing stream saved and loaded: LMStream.load takes no signing key and the
# folder records none, so every later forget issues an unsigned receipt (verify-forget
# --public-key then says FAILED: "not signed"), and nothing could refuse a wrong key as
# SVDDMemory.load does (#35 item 9). Now the manifest records the signer's fingerprint
# and LMStream.load(..., signing_key=) refuses another controller's key
def test_a_loaded_signing_stream_keeps_signing(forgot, tmp_path):
    from svattn.exact.records.signing import generate_key

    model, key = forgot[0], generate_key()
    s = model.stream(signing_key=key)
    s.feed(text_of(40))
    s.forget(10, 14)
    s.save(tmp_path / "st")
    with pytest.raises(ValueError):
        LMStream.load(tmp_path / "st", model, signing_key=generate_key())
    t = LMStream.load(tmp_path / "st", model, signing_key=key)
    receipt = t.forget(20, 22).receipt
    assert verify_forget(t, receipt, public_key=key.public_key()).status == "VERIFIED"
    t.save(tmp_path / "st")  # the fingerprint is kept across saves
    assert LMStream.load(tmp_path / "st", model, signing_key=key)._signing_key is not None
    assert LMStream.load(tmp_path / "st", model)._signing_key is None  # reads unsigned
