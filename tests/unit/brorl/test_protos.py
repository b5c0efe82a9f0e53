import filecmp
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_stubs_are_current(tmp_path):
    subprocess.run(
        ["bash", str(ROOT / "scripts/gen_protos.sh"), str(tmp_path)], check=True, cwd=ROOT
    )
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / "brorl/v1").glob("*.py*"))
    assert generated, "protoc produced nothing"
    for rel in generated:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is not committed; run scripts/gen_protos.sh"
        assert filecmp.cmp(committed, tmp_path / rel, shallow=False), (
            f"{rel} is stale; run scripts/gen_protos.sh"
        )
