"""Damaged files in the plan store (``te_cudnn.plans.store``): every truncation and corruption
of a plan file is skipped with a warning, once per cause, and rebuilt; ``PlanStore.read`` says
what is wrong; CPU only.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from te_cudnn.plans.store import MAGIC, PlanFileError, PlanStore

from _plan_helpers import FACTS
from _plan_store_cpu import BLOB, Recorder, desc, store  # noqa: F401 - store: the fixture


def _corruptions(good: bytes) -> dict[str, tuple[bytes, str]]:
    head_len = struct.unpack("<I", good[len(MAGIC) : len(MAGIC) + 4])[0]
    body = len(MAGIC) + 4 + head_len
    flipped = bytearray(good)
    flipped[body + 100] ^= 0x01
    out = {
        "flipped_blob_byte": (bytes(flipped), "corrupted"),
        "empty": (b"", "bad magic"),
        "garbage": (os.urandom(64), "bad magic"),
        "garbage_long": (b"\x89PNG\r\n" + os.urandom(4000), "bad magic"),
        "wrong_magic_version": (b"TECUDNN-PLAN\x02" + good[len(MAGIC) :], "bad magic"),
        "huge_header_length": (MAGIC + struct.pack("<I", 1 << 30) + good[len(MAGIC) + 4 :], "unreadable header"),
        "header_not_utf8": (MAGIC + struct.pack("<I", 4) + b"\xff\xfe\xfd\xfc" + BLOB, "unreadable header"),
        "header_nested_deeply": (MAGIC + struct.pack("<I", 200_000) + b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    }
    cuts = {
        "in_magic_1": (1, "bad magic"), "in_magic_7": (7, "bad magic"), "after_magic": (len(MAGIC), "truncated header"),
        "in_length": (len(MAGIC) + 2, "truncated header"), "after_length": (len(MAGIC) + 4, "unreadable header"),
        "in_header": (len(MAGIC) + 4 + head_len // 2, "unreadable header"), "after_header": (body, "corrupted"),
        "in_blob": (body + len(BLOB) // 2, "corrupted"), "last_byte": (len(good) - 1, "corrupted"),
    }  # fmt: skip
    out.update({f"truncated_{k}": (good[:n], msg) for k, (n, msg) in cuts.items()})
    out["extra_bytes"] = (good + b"\x00", "corrupted")
    return out


CORRUPTIONS = [
    "flipped_blob_byte", "empty", "garbage", "garbage_long", "wrong_magic_version", "huge_header_length",
    "header_not_utf8", "header_nested_deeply", "truncated_in_magic_1", "truncated_in_magic_7", "truncated_after_magic",
    "truncated_in_length", "truncated_after_length", "truncated_in_header", "truncated_after_header",
    "truncated_in_blob", "truncated_last_byte", "extra_bytes",
]  # fmt: skip


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupt_file_is_skipped_with_warning(store: PlanStore, kind: str) -> None:
    d = desc()
    path = store.save(d, BLOB)
    cases = _corruptions(path.read_bytes())
    assert set(cases) == set(CORRUPTIONS)
    data, message = cases[kind]
    path.write_bytes(data)
    with pytest.warns(UserWarning, match="skipping plan file .*rebuilt"):
        assert store.load(d) is None  # never raises
    with pytest.raises(PlanFileError, match=message):
        PlanStore.read(path)
    store.save(d, BLOB)  # the rebuilt plan replaces the bad file
    assert store.load(d).blob == BLOB


def test_non_object_header_is_skipped(store: PlanStore) -> None:
    d = desc()
    path = store.save(d, BLOB)
    path.write_bytes(MAGIC + struct.pack("<I", 2) + b"[]" + BLOB)
    with Recorder() as seen:
        assert store.load(d) is None
    assert len(seen) == 1 and "skipping plan file" in seen[0] and "not an object" in seen[0]


def test_read_error_messages_are_clear(tmp_path: Path) -> None:
    p = tmp_path / "x.plan"
    p.write_bytes(b"hello world")
    with pytest.raises(ValueError, match=r"^not a te_cudnn plan file \(bad magic\)$"):
        PlanStore.read(p)
    p.write_bytes(MAGIC + b"\x01")
    with pytest.raises(ValueError, match="^truncated header$"):
        PlanStore.read(p)
    p.write_bytes(MAGIC + struct.pack("<I", 3) + b"{x}")
    with pytest.raises(ValueError, match="^unreadable header: "):
        PlanStore.read(p)
    head = json.dumps({"size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}).encode()
    p.write_bytes(MAGIC + struct.pack("<I", len(head)) + head + b"abd")
    with pytest.raises(ValueError, match=r"size/checksum mismatch"):
        PlanStore.read(p)
    p.write_bytes(MAGIC + struct.pack("<I", len(head)) + head + b"abc")
    assert PlanStore.read(p).blob == b"abc"


def test_one_warning_per_cause_not_per_call(store: PlanStore) -> None:
    descs = [desc(max_seqlen_q=64 * (i + 1)) for i in range(6)]
    paths = [store.save(d, BLOB) for d in descs]
    for p in paths[:3]:  # truncated in the plan bytes (the same cause as a flipped bit)
        p.write_bytes(p.read_bytes()[:-10])
    flipped = bytearray(paths[3].read_bytes())
    flipped[-5] ^= 0x40
    paths[3].write_bytes(bytes(flipped))
    paths[4].write_bytes(b"")  # zero length
    with Recorder() as seen:
        for _ in range(5):
            assert [store.load(d) for d in descs[:5]] == [None] * 5
    assert len(seen) == 2, seen
    assert "size/checksum mismatch" in seen[0] and str(paths[0]) in seen[0] and "without another warning" in seen[0]
    assert "bad magic" in seen[1] and str(paths[4]) in seen[1]
    assert store.load(descs[5]).blob == BLOB  # good files are unaffected
    # another store object (another process) reports again
    with Recorder() as seen:
        assert PlanStore(store.root, FACTS).load(descs[0]) is None
    assert len(seen) == 1
