"""A tensor of more than 2^31 bytes (label `large`): a 2.1 GiB float16 [34816, 32768] tensor, sparse on
disk except for a few rows, including the rows on both sides of byte 2^31. inspect lists it; quantize
(int8 per-channel) writes a file that the official safetensors package reads, whose rows match the
NumPy formula, within bounded memory (the resident set stays far below the tensor's size)."""
import json
import os
import resource
import subprocess

from xquant_cli_support import XQ, expected_q, np, raw_file, xquant

import safetensors
from safetensors import safe_open

ROWS, COLS = 34816, 32768  # 2,281,701,376 bytes of float16
ROW_BYTES = COLS * 2
FILLED = [0, 1, 32767, 32768, 34815]  # rows 32767 / 32768 end / start at byte 2^31 of the data


def test_tensor_over_2_pow_31_bytes(tmp_path):
    assert ROWS * ROW_BYTES > 2 ** 31 and 32768 * ROW_BYTES == 2 ** 31
    src = tmp_path / "large.safetensors"
    hdr = json.dumps({"__metadata__": {"format": "pt"},
                      "w": {"dtype": "F16", "shape": [ROWS, COLS], "data_offsets": [0, ROWS * ROW_BYTES]},
                      "b": {"dtype": "F16", "shape": [8], "data_offsets": [ROWS * ROW_BYTES, ROWS * ROW_BYTES + 16]}})
    hdr += " " * ((8 - (8 + len(hdr)) % 8) % 8)
    raw_file(src, hdr)
    start = 8 + len(hdr)
    rs = np.random.RandomState(3)
    rows = {r: (rs.standard_normal(COLS) * (1 + r % 7)).astype(np.float16) for r in FILLED}
    bias = np.arange(8, dtype=np.float16)
    with open(src, "r+b") as f:
        f.truncate(start + ROWS * ROW_BYTES + 16)
        for r, v in rows.items():
            f.seek(start + r * ROW_BYTES)
            f.write(v.tobytes())
        f.seek(start + ROWS * ROW_BYTES)
        f.write(bias.tobytes())

    r = xquant("inspect", src)
    assert r.returncode == 0, r.stderr
    assert "[34816, 32768]" in r.stdout and "2.28 GB" in r.stdout

    out = tmp_path / "large-int8.safetensors"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run([XQ, "quantize", str(src), "-o", str(out), "--report", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kb < 1024 * 1024, f"peak RSS {peak_kb} kB (before {before} kB)"  # < 1 GiB for a 2.28 GB tensor
    rep = json.loads((tmp_path / "r.json").read_text())
    t = {x["name"]: x for x in rep["tensors"]}
    assert t["w"]["action"] == "quantized" and t["w"]["bytes_in"] == ROWS * ROW_BYTES
    assert t["b"]["action"] == "kept"

    with safe_open(str(out), framework="numpy") as f:
        assert f.metadata()["xquant.bits"] == "8"
        q, s = f.get_slice("w"), f.get_slice("w.scale")
        assert q.get_shape() == [ROWS, COLS] and q.get_dtype() == "I8"
        for row, v in rows.items():
            scale = s[row:row + 1]
            x = v.astype(np.float32)
            assert scale[0, 0] == np.abs(x).max() / np.float32(127)
            assert np.array_equal(q[row:row + 1][0].astype(np.int32), expected_q(x, scale[0], 0, 8)), row
        # Zero rows: scale 1, stored zeros (spot checks, including just before / after the filled rows).
        for row in (2, 32766, 32769, 34814):
            assert s[row:row + 1][0, 0] == 1.0
            assert not q[row:row + 1].any()
        assert np.array_equal(f.get_tensor("b"), bias)
    assert os.path.getsize(out) < ROWS * COLS + 2 * 1024 * 1024
