"""A part's ``_metadata`` file: its body as canonical JSON, then the body's SHA-256. Read back as
written, indented by hand (or by an earlier writer), and refused whole when any byte of it changed."""

from __future__ import annotations

import json

import pytest

from statehouse.snapshots.errors import SnapshotCorrupt
from statehouse.snapshots.metadata import SnapshotMetadata
from statehouse.snapshots.storage import open_storage
from tests.support.job_contents import populate


@pytest.fixture
def written(make_catalog, make_manager, tmp_path) -> tuple[SnapshotMetadata, bytes]:
    catalog = make_catalog()
    job, _ = catalog.create("orders", 128)
    populate(job, 50, tag="é ✓ \U0001f600")  # non-ASCII in the states, and below in the user metadata
    storage = open_storage(str(tmp_path / "cp"))
    manager = make_manager(catalog, storage)
    manager.trigger("orders", 1, metadata={"note": "café ✓", "offsets": [1, 2.5, None, True]})
    manager.complete("orders", 1)
    [path] = [p for p in storage.list("orders/chk-1") if "_metadata" in p]
    data = storage.read(path)
    return SnapshotMetadata.from_bytes(data, path), data


def test_the_file_is_its_canonical_body_then_its_digest(written):
    metadata, data = written
    wrapper = json.loads(data)
    assert list(wrapper) == ["body", "sha256"]
    assert data.startswith(b'{"body":' + json.dumps(wrapper["body"], sort_keys=True, separators=(",", ":")).encode())
    assert metadata.to_bytes() == data
    assert SnapshotMetadata.from_bytes(metadata.to_bytes(), "again") == metadata
    assert metadata.user_metadata == {"note": "café ✓", "offsets": [1, 2.5, None, True]}


@pytest.mark.parametrize("indent", [1, 2, None])
def test_the_same_wrapper_written_otherwise_reads_alike(written, indent):
    metadata, data = written
    wrapper = json.loads(data)
    other = json.dumps({"sha256": wrapper["sha256"], "body": wrapper["body"]}, indent=indent, ensure_ascii=False)
    assert SnapshotMetadata.from_bytes(other.encode(), "indented") == metadata


def test_any_byte_changed_is_refused(written):
    _metadata, data = written
    for at in range(0, len(data), max(1, len(data) // 400)):
        changed = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
        try:
            read = SnapshotMetadata.from_bytes(changed, "changed")
        except SnapshotCorrupt:
            continue
        # Only a change JSON cannot see may pass: none here (no whitespace to flip).
        pytest.fail(f"a byte changed at {at} was read: {read}")
    for cut in (1, 10, len(data) // 2, len(data) - 1):
        with pytest.raises(SnapshotCorrupt):
            SnapshotMetadata.from_bytes(data[:cut], "truncated")
