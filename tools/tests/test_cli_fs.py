"""File-system safety of the xquant command (issue 17): outputs never overwrite or remove an input, --force
replaces only what xquant wrote, hostile model directories (deep JSON, huge indexes, symlink loops and
escapes, thousands of shards, stray shard names, long names) and signals leave nothing behind, and
config.json is read and written back by one JSON reader (docs/cli.md, "Model directories").

Big inputs are generated here at test time (sparse where large) and kept small enough to run in seconds.
"""
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import time

import pytest

from xquant_cli_support import ROOT, XQ, np, read_official, save_official, xquant

SAMPLE_MODEL = os.path.join(ROOT, "data", "sample-model")
MARKER = ".xquant-output"


def snapshot(d):
    """{relative path: sha256} of every file below d (links not followed), to prove nothing changed."""
    out = {}
    for root, dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            if os.path.islink(p):
                out[os.path.relpath(p, d)] = "link:" + os.readlink(p)
                continue
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def hidden_leftovers(parent):
    return [e for e in os.listdir(parent) if ".xquant-" in e and e.startswith(".")]


def copy_sample(dst):
    shutil.copytree(SAMPLE_MODEL, dst)
    return dst


def raw_safetensors(path, names, shape=(1,)):
    """A safetensors file of F32 tensors of `shape`, written directly (fast for 100k tensors)."""
    n = int(np.prod(shape))
    hdr = {"__metadata__": {"format": "pt"}}
    for i, name in enumerate(names):
        hdr[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [4 * n * i, 4 * n * (i + 1)]}
    text = json.dumps(hdr, separators=(",", ":"))
    text += " " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode())
        f.write(np.arange(n * len(names), dtype=np.float32).tobytes())


def sharded_model(d, shards, config=None):
    """A model directory with an index; shards: list of lists of tensor names (F32 [1] each)."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config or {"model_type": "llama", "torch_dtype": "float32"}, f)
    wmap = {}
    for i, names in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        raw_safetensors(os.path.join(d, fn), names)
        wmap.update({n: fn for n in names})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 4 * len(wmap)}, "weight_map": wmap}, f)


# ---------------------------------------------------------------------------------------------------
# 1. Outputs are never an input, inside one or around one.

def test_output_containing_the_input_is_refused(tmp_path):
    models = tmp_path / "models"
    llama = copy_sample(models / "llama")
    (models / "notes.txt").write_text("mine")
    before = snapshot(models)
    os.symlink(models, tmp_path / "link")
    for out in [models, str(llama) + "/..", tmp_path, tmp_path / "link", llama, str(llama) + "/",
                llama / "quantized", llama / "sub" / "deeper"]:
        for cmd in ["quantize", "dequantize"]:
            r = xquant(cmd, llama, "-o", out, "--force", "-q")
            assert r.returncode == 1, (cmd, out, r.stderr)
            assert "an output may not be, contain or lie inside an input" in r.stderr, r.stderr
            assert snapshot(models) == before
    # a relative spelling from inside the model directory
    r = xquant("quantize", ".", "-o", "..", "--force", cwd=llama)
    assert r.returncode == 1 and "contains" in r.stderr, r.stderr
    assert snapshot(models) == before and not hidden_leftovers(models) and not hidden_leftovers(tmp_path)


def test_report_inside_the_input_is_refused(tmp_path):
    src = copy_sample(tmp_path / "m")
    before = snapshot(src)
    out = tmp_path / "out"
    r = xquant("quantize", src, "-o", out, "--report", src / "config.json", "--force", "-q")
    assert r.returncode == 1 and "--report" in r.stderr and "lies inside" in r.stderr, r.stderr
    assert snapshot(src) == before and not out.exists()
    r = xquant("quantize", src, "-o", out, "--report", out / "r.json", "-q")
    assert r.returncode == 1 and "--report" in r.stderr, r.stderr
    assert not out.exists()


def test_single_file_output_is_not_the_input(tmp_path):
    f = tmp_path / "in.safetensors"
    shutil.copy(os.path.join(ROOT, "data", "sample.safetensors"), f)
    before = snapshot(tmp_path)
    os.symlink(f, tmp_path / "alias.safetensors")
    for out in [f, tmp_path / "alias.safetensors", tmp_path / "." / "in.safetensors"]:
        r = xquant("quantize", f, "-o", out, "--force", "-q")
        assert r.returncode == 1 and " is " in r.stderr, r.stderr
        r = xquant("dequantize", f, "-o", out, "--force", "-q")
        assert r.returncode == 1 and " is " in r.stderr, r.stderr
        r = xquant("quantize", f, "-o", tmp_path / "q.safetensors", "--report", out, "--force", "-q")
        assert r.returncode == 1 and "--report" in r.stderr, r.stderr
    os.unlink(tmp_path / "alias.safetensors")
    assert snapshot(tmp_path) == before


def test_force_replaces_only_what_xquant_wrote(tmp_path):
    out = tmp_path / "out"
    # an empty directory: replaced
    out.mkdir()
    r = xquant("quantize", SAMPLE_MODEL, "-o", out, "-q", "--force")
    assert r.returncode == 0, r.stderr
    assert (out / MARKER).is_file() and (out / "model.safetensors").is_file()
    # xquant's own output: replaced (the old files go)
    (out / "stale.txt").write_text("from the first run")
    r = xquant("quantize", SAMPLE_MODEL, "-o", out, "-q", "--force", "--preset", "W8A8")
    assert r.returncode == 0, r.stderr
    assert "stale.txt" not in os.listdir(out) and (out / MARKER).is_file()
    assert not hidden_leftovers(tmp_path)
    # anything else: refused, untouched
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "only-copy.bin").write_bytes(b"precious")
    for target in [mine, tmp_path / "file.txt", tmp_path / "link"]:
        if target.name == "file.txt":
            target.write_text("x")
        if target.name == "link":  # a link to another xquant output: the link is what -o names
            assert xquant("quantize", SAMPLE_MODEL, "-o", tmp_path / "other", "-q").returncode == 0
            os.symlink(tmp_path / "other", target)
        for cmd, src in [("quantize", SAMPLE_MODEL), ("dequantize", out)]:
            r = xquant(cmd, src, "-o", target, "-q", "--force")
            assert r.returncode == 1, (cmd, target, r.stderr)
            assert "--force replaces only an empty directory or one that xquant wrote" in r.stderr, r.stderr
    assert (mine / "only-copy.bin").read_bytes() == b"precious" and os.listdir(mine) == ["only-copy.bin"]
    assert (tmp_path / "file.txt").read_text() == "x" and os.path.islink(tmp_path / "link")
    assert not hidden_leftovers(tmp_path)
    # the dequantized directory is an xquant output too
    back = tmp_path / "back"
    assert xquant("dequantize", out, "-o", back).returncode == 0
    assert (back / MARKER).is_file()
    r = xquant("dequantize", out, "-o", back, "--force")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------------
# 2. Deep JSON: a clear error, no crash, nothing left behind.

@pytest.mark.parametrize("where", ["config", "index"])
def test_deeply_nested_json(tmp_path, where):
    depth = 1_000_000
    d = tmp_path / "m"
    sharded_model(d, [["a.weight"], ["b.weight"]])
    deep = "[" * depth + "]" * depth
    if where == "config":
        (d / "config.json").write_text('{"model_type": "llama", "x": ' + deep + "}")
        name = "config.json"
    else:
        (d / "model.safetensors.index.json").write_text('{"weight_map": ' + deep + "}")
        name = "model.safetensors.index.json"
    for args in [("quantize", d, "-o", tmp_path / "out"), ("dequantize", d, "-o", tmp_path / "out"),
                 ("inspect", d), ("inspect", d, "--json")]:
        r = xquant(*args, timeout=60)
        assert r.returncode == 1, (args, r.returncode, r.stderr[-500:])
        assert f"{name}: malformed JSON at line 1, column" in r.stderr and "nested deeper than 256 levels" in r.stderr
        assert not (tmp_path / "out").exists() and not hidden_leftovers(tmp_path)


# ---------------------------------------------------------------------------------------------------
# 3. Large indexes in linear time; symlink loops end.

def test_index_with_100k_entries_is_fast(tmp_path):
    n = 100_000
    names = [f"model.layers.{i // 10}.t{i % 10}.bias" for i in range(n)]
    d = tmp_path / "m"
    sharded_model(d, [names[: n // 2], names[n // 2:]])
    t0 = time.monotonic()
    r = xquant("quantize", d, "-o", tmp_path / "out", "-q", timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < 60, f"{took:.1f} s for a 100k-entry index (quadratic lookup?)"
    with open(tmp_path / "out" / "model.safetensors.index.json") as f:
        index = json.load(f)
    assert len(index["weight_map"]) == n and list(index["weight_map"]) == sorted(names)
    r = xquant("inspect", tmp_path / "out", "--json", timeout=300)
    assert r.returncode == 0 and len(json.loads(r.stdout)["files"]) == 2


def test_symlink_loops_end(tmp_path):
    d = copy_sample(tmp_path / "m")
    (d / "sub").mkdir()
    (d / "sub" / "tok.txt").write_text("t")
    for i in range(10):
        os.symlink(".", d / f"loop{i}")
        os.symlink("..", d / "sub" / f"up{i}")
    os.symlink("self", d / "self")  # a link to itself: dangling
    r = xquant("quantize", d, "-o", tmp_path / "out", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "loop0: a directory that contains itself" in r.stderr and "sub/up0" in r.stderr
    files = sorted(os.path.relpath(os.path.join(a, f), tmp_path / "out") for a, _, fs in os.walk(tmp_path / "out") for f in fs)
    assert files == [MARKER, "config.json", "generation_config.json", "model.safetensors", "sub/tok.txt"]
    r = xquant("quantize", d, "-o", tmp_path / "out2", "-q", timeout=60)
    assert r.returncode == 0 and r.stderr == ""  # -q: no warnings


# ---------------------------------------------------------------------------------------------------
# 4. Links that leave the model directory are not followed (a Hugging Face cache snapshot still works).

def test_symlinks_leaving_the_model_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_text("secret")
    (outside / "deep" / "x.txt").write_text("x")
    d = copy_sample(tmp_path / "m")
    os.symlink(outside, d / "share")                 # a directory outside
    os.symlink(outside / "secret.txt", d / "secret.txt")  # a file outside
    os.symlink("/usr/share", d / "system")           # the case
    (d / "inner").mkdir()
    (d / "inner" / "a.txt").write_text("a")
    os.symlink("inner", d / "inner-link")            # inside: followed
    os.symlink("inner/a.txt", d / "a-link.txt")
    r = xquant("quantize", d, "-o", tmp_path / "out", "--report", tmp_path / "r.json", timeout=60)
    assert r.returncode == 0, r.stderr
    for name in ["share", "secret.txt", "system"]:
        assert f"{name}: a symbolic link to " in r.stderr and "outside the model directory (not followed)" in r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert sorted(e.split(":")[0] for e in report["not_followed"]) == ["secret.txt", "share", "system"]
    out = tmp_path / "out"
    assert not (out / "share").exists() and not (out / "secret.txt").exists() and not (out / "system").exists()
    assert (out / "inner-link" / "a.txt").read_text() == "a" and (out / "a-link.txt").read_text() == "a"
    assert not any(os.path.islink(os.path.join(a, f)) for a, _, fs in os.walk(out) for f in fs)


def test_hugging_face_cache_snapshot(tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in os.listdir(SAMPLE_MODEL):
        blob = blobs / hashlib.sha256(f.encode()).hexdigest()
        shutil.copy(os.path.join(SAMPLE_MODEL, f), blob)
        os.symlink(os.path.relpath(blob, snap), snap / f)
    (blobs / "tok").write_text("tokenizer")
    os.symlink("../../blobs/tok", snap / "tokenizer.json")
    r = xquant("quantize", snap, "-o", tmp_path / "out")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "tokenizer"
    assert (tmp_path / "out" / "generation_config.json").is_file()
    r = xquant("quantize", snap, "-o", blobs / "out")
    assert r.returncode == 1 and "lies inside" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------------
# 5. Thousands of shards, stray shard names, long output names.

def _limit_files(soft, hard=None):
    def f():
        h = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if hard is None else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, h))
    return f


def test_more_shards_than_the_soft_open_file_limit(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the hard limit of open files is {hard}; this test needs 1300 to raise the soft limit of 1024 to")
    n = 1100
    d = tmp_path / "m"
    sharded_model(d, [[f"t{i}.bias"] for i in range(n)])
    r = subprocess.run([XQ, "quantize", str(d), "-o", str(tmp_path / "out"), "-q"], capture_output=True, text=True,
                       preexec_fn=_limit_files(1024), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len([f for f in os.listdir(tmp_path / "out") if f.endswith(".safetensors")]) == n
    # a hard limit too low: a clear error before anything is written
    r = subprocess.run([XQ, "quantize", str(d), "-o", str(tmp_path / "out2"), "-q"], capture_output=True, text=True,
                       preexec_fn=_limit_files(256, 256), timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "needs 1100 files open at once" in r.stderr and "limit of open files is 256" in r.stderr, r.stderr
    assert not (tmp_path / "out2").exists() and not hidden_leftovers(tmp_path)


def test_stray_shard_name_in_the_input(tmp_path):
    r = xquant("quantize", SAMPLE_MODEL, "-o", tmp_path / "first", "--max-shard-size", "400kB", "-q")
    assert r.returncode == 0, r.stderr
    shards = sorted(f for f in os.listdir(tmp_path / "first") if f.endswith(".safetensors"))
    assert len(shards) >= 2
    d = copy_sample(tmp_path / "m")
    (d / shards[0]).write_bytes(b"stale shard of an older export")  # not model.safetensors: not read
    r = xquant("quantize", d, "-o", tmp_path / "out", "--max-shard-size", "400kB")
    assert r.returncode == 0, r.stderr
    assert f"not copying {d / shards[0]}: the output writes its own {shards[0]}" in r.stderr, r.stderr
    for f in shards:
        assert (tmp_path / "out" / f).read_bytes() == (tmp_path / "first" / f).read_bytes()


def test_long_output_name(tmp_path):
    name = "q" * 250
    r = xquant("quantize", SAMPLE_MODEL, "-o", tmp_path / name, "-q")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / name / "model.safetensors").is_file()
    f = tmp_path / ("f" * 250)
    r = xquant("quantize", os.path.join(ROOT, "data", "sample.safetensors"), "-o", f, "-q")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == sorted([name, f.name])


# ---------------------------------------------------------------------------------------------------
# 6. Every catchable terminating signal removes the temporary directory (and file).

SIGNALS = ["SIGHUP", "SIGQUIT", "SIGPIPE", "SIGUSR1", "SIGALRM", "SIGXCPU"]


def _big_sparse(path, rows, cols):
    hdr = json.dumps({"model.layers.0.mlp.up_proj.weight": {"dtype": "F16", "shape": [rows, cols],
                                                            "data_offsets": [0, rows * cols * 2]}})
    hdr += " " * (-(8 + len(hdr)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr.encode())
        f.truncate(8 + len(hdr) + rows * cols * 2)


@pytest.fixture(scope="module")
def big_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text('{"model_type": "llama", "torch_dtype": "float16"}')
    _big_sparse(d / "model" / "model.safetensors", 32768, 32768)  # 2 GiB, sparse
    return d


@pytest.mark.parametrize("mode", ["directory", "file"])
@pytest.mark.parametrize("name", SIGNALS)
def test_signals_leave_nothing(tmp_path, big_inputs, mode, name):
    sig = getattr(signal, name)
    src = big_inputs / "model"
    if mode == "file":
        src = src / "model.safetensors"
    work = tmp_path / "work"
    work.mkdir()
    out = work / ("out" if mode == "directory" else "out.safetensors")
    args = [XQ, "quantize", str(src), "-o", str(out), "--threads", "1"]
    if mode == "file":
        args += ["--format", "xquant"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    started = (lambda: any(n.endswith(".safetensors") for _, _, fs in os.walk(work) for n in fs)) if mode == "directory" \
        else (lambda: bool(os.listdir(work)))
    while not started() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.001)
    assert p.poll() is None, "finished before it could be interrupted"
    time.sleep(0.02)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert "no output written" in err
    assert os.listdir(work) == []


# ---------------------------------------------------------------------------------------------------
# 7. One JSON reader: Python's values kept byte for byte, typed errors, non-UTF-8 paths.

def test_config_values_kept_byte_for_byte(tmp_path):
    d = copy_sample(tmp_path / "m")
    cfg = (d / "config.json").read_text()
    special = ('"big_int": 123456789012345678901234567890, "inf": Infinity, "ninf": -Infinity, "nan": NaN, '
               '"eps": 1e-05, "exact": 10000.0, "esc": "caf\\u00e9 \\ud800",\n  ')
    cfg = cfg.replace('"architectures"', special + '"architectures"', 1)
    (d / "config.json").write_text(cfg)
    r = xquant("quantize", d, "-o", tmp_path / "out", "-q")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "out" / "config.json").read_text()
    for token in ['"big_int": 123456789012345678901234567890', '"inf": Infinity', '"ninf": -Infinity', '"nan": NaN',
                  '"eps": 1e-05', '"exact": 10000.0', '"esc": "caf\\u00e9 \\ud800"']:
        assert token in text, token
    # Python (and so transformers) reads it back with the same values
    j = json.loads(text)
    assert j["big_int"] == 123456789012345678901234567890 and j["inf"] == float("inf") and j["nan"] != j["nan"]
    assert j["quantization_config"]["quant_method"] == "compressed-tensors"
    # dequantize writes it back without the quantization_config, same tokens
    r = xquant("dequantize", tmp_path / "out", "-o", tmp_path / "back", "-q")
    assert r.returncode == 0, r.stderr
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert "quantization_config" not in back and back["big_int"] == 123456789012345678901234567890
    r = xquant("inspect", tmp_path / "out", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["quantization_config"]["format"] == "pack-quantized"


@pytest.mark.parametrize("field,value,needle", [
    ("num_bits", 4.7, "weights.num_bits: expected an integer from 4 to 8, got number 4.7"),
    ("num_bits", "4", "weights.num_bits: expected an integer from 4 to 8, got string \"4\""),
    ("group_size", 1e300, "weights.group_size: expected an integer from 1 to 9223372036854775807, got number 1e+300"),
    ("group_size", 10 ** 20, "weights.group_size: expected an integer from 1 to 9223372036854775807, got 100000000000000000000"),
    ("symmetric", "true", "weights.symmetric: expected true or false, got string \"true\""),
    ("type", 1, "weights.type: expected a string, got number 1"),
])
def test_mistyped_quantization_config(tmp_path, field, value, needle):
    q = tmp_path / "q"
    assert xquant("quantize", SAMPLE_MODEL, "-o", q, "-q", "--group-size", "32").returncode == 0
    cfg = json.loads((q / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"][field] = value
    (q / "config.json").write_text(json.dumps(cfg))
    for args in [("dequantize", q, "-o", tmp_path / "back"), ("inspect", q)]:
        r = xquant(*args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("xquant: error: " + str(q / "config.json") + ": quantization_config.config_groups.group_0"), r.stderr
        assert needle in r.stderr, r.stderr
        assert "json.exception" not in r.stderr and "type_error" not in r.stderr
    assert not (tmp_path / "back").exists()
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"][field] = value
    cfg["quantization_config"]["format"] = 7
    (q / "config.json").write_text(json.dumps(cfg))
    r = xquant("inspect", q)
    assert r.returncode == 1 and "quantization_config.format: expected a string, got number 7" in r.stderr, r.stderr


def test_inspect_json_with_non_utf8_paths(tmp_path):
    d = os.path.join(os.fsencode(tmp_path), b"m\xff\xfe")
    shutil.copytree(os.fsencode(SAMPLE_MODEL), d)
    with open(os.path.join(d, b"tok\xe9.txt"), "wb") as f:
        f.write(b"t")
    r = subprocess.run([XQ, "inspect", d, "--json"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.decode("utf-8"))  # strict UTF-8: valid JSON text
    assert j["directory"].endswith("m\\xFF\\xFE") and j["other_files"] == ["generation_config.json", "tok\\xE9.txt"]
