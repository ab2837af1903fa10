"""`dspark pull` against a local stand-in for the Hugging Face hub (tests/py/hubserver.py).

The repo is tools/make_tiny_hf.py's tiny Qwen3 (bf16) plus a file in a subdirectory. Checked:
the hub cache layout that huggingface_hub writes (blobs named by SHA-256 / git blob id,
snapshots/COMMIT/* relative links, refs/REV) and `dspark generate -m org/name` on it giving the
same text as the source directory; --include; a revision that is a tag; a second pull that
downloads nothing; resume of a partial file with Range; a connection dropped mid-file (resumed) and
dropped on every attempt (a clear error, the part kept for the next pull); 503s retried; a corrupted file (an
error, nothing left in place); 404s (repo, revision, file); 401 without a token and success with
HF_TOKEN (never sent to the CDN); a renamed repo (relative redirect); HF_HUB_OFFLINE; file names
and etags a hostile server could send.
"""
import hashlib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_hf as mth  # noqa: E402
from hubserver import Hub, Repo, git_blob_id  # noqa: E402

BUILD = os.environ.get("DSP_BUILD_DIR", os.path.join(ROOT, "build", "release"))
DSPARK = os.environ.get("DSPARK_BIN", os.path.join(BUILD, "dspark"))
COMMIT = "c0ffee" + "0" * 34
COMMIT2 = "beef" + "1" * 36
SAFE = "model.safetensors"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("src"))
    mth.make_all(out, ["tiny-qwen3-hf-bf16"])
    d = os.path.join(out, "tiny-qwen3-hf-bf16")
    files = {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}
    files["extra/notes.txt"] = b"a file in a subdirectory\n"
    return d, files


@pytest.fixture
def hub(model):
    h = Hub()
    h.repos["tiny-org/tiny-qwen3"] = Repo(dict(model[1]), COMMIT, {"main": COMMIT, "v1.0": COMMIT2})
    h.repos["tiny-org/private"] = Repo(dict(model[1]), COMMIT, private=True)
    yield h
    h.close()


def pull(hub, tmp_path, *args, env=None, ok=True):
    e = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hub"), HOME=str(tmp_path))
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN_PATH"):
        e.pop(k, None)
    e.update(env or {})
    r = subprocess.run([DSPARK, "pull", *args], capture_output=True, text=True, timeout=300, env=e)
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    if ok:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 1, r.stdout + r.stderr
    return r


def repo_dir(tmp_path, repo="tiny-org/tiny-qwen3"):
    return tmp_path / "hub" / ("models--" + repo.replace("/", "--"))


def blob_name(name, data):
    return hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_id(data)


def check_snapshot(tmp_path, files, commit=COMMIT, repo="tiny-org/tiny-qwen3"):
    rd = repo_dir(tmp_path, repo)
    snap = rd / "snapshots" / commit
    for name, data in files.items():
        link = snap / name
        assert link.is_symlink(), name
        target = os.readlink(link)  # relative, into blobs/, as huggingface_hub writes it
        assert not os.path.isabs(target) and target.endswith("blobs/" + blob_name(name, data)), target
        assert link.read_bytes() == data, name
    assert sorted(os.listdir(rd / "blobs")) == sorted({blob_name(n, d) for n, d in files.items()})
    return snap


def test_pull_then_generate(hub, model, tmp_path):
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    snap = check_snapshot(tmp_path, model[1])
    assert r.stdout.strip() == str(snap)
    assert (repo_dir(tmp_path) / "refs" / "main").read_text() == COMMIT
    api = hub.requests("GET", "/api/models/tiny-org/tiny-qwen3/revision/main")
    assert len(api) == 1 and "blobs=true" in api[0]["query"]
    assert len(hub.requests("HEAD", "/tiny-org/tiny-qwen3/resolve/")) == len(model[1])
    assert len(hub.requests("GET", "/cdn/")) == 1  # the one LFS file came from the "CDN"
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    gen = [DSPARK, "generate", "-p", "Hello there", "-n", "12", "--mode", "baseline"]
    a = subprocess.run(gen + ["-m", "tiny-org/tiny-qwen3"], capture_output=True, text=True, timeout=300, env=env)
    b = subprocess.run(gen + ["-m", model[0]], capture_output=True, text=True, timeout=300)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and a.stdout.strip()
    # pulling again downloads nothing: the listing and one HEAD per file, no bytes
    n_get = len(hub.requests("GET"))
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    assert len(hub.requests("GET")) == n_get + 1 and "already in the cache" in r.stderr


def test_include_and_tag(hub, model, tmp_path):
    pull(hub, tmp_path, "tiny-org/tiny-qwen3@v1.0", "--include", "*.json", "--include", "extra/*")
    want = {n: d for n, d in model[1].items() if n.endswith(".json") or n.startswith("extra/")}
    check_snapshot(tmp_path, want, COMMIT2)
    assert (repo_dir(tmp_path) / "refs" / "v1.0").read_text() == COMMIT2
    assert not hub.requests("GET", "/cdn/")
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", "--include", "*.bin", ok=False)
    assert "no file matches --include" in r.stderr


def test_resume_partial_file(hub, model, tmp_path):
    data = model[1][SAFE]
    blobs = repo_dir(tmp_path) / "blobs"
    blobs.mkdir(parents=True)
    half = len(data) // 2
    (blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")).write_bytes(data[:half])
    pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    check_snapshot(tmp_path, model[1])
    cdn = hub.requests("GET", "/cdn/")
    assert [c["range"] for c in cdn] == [f"bytes={half}-"]


def test_dropped_connection_resumes(hub, model, tmp_path):
    hub.faults[SAFE] = {"drop_after": 100_000, "times": 2}  # the first two transfers die mid-file
    pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    check_snapshot(tmp_path, model[1])
    assert [c["range"] for c in hub.requests("GET", "/cdn/")] == [None, "bytes=100000-", "bytes=200000-"]


def test_server_errors_are_retried(hub, model, tmp_path):
    hub.faults[SAFE] = {"status": 503, "status_times": 2}
    pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    check_snapshot(tmp_path, model[1])
    assert len(hub.requests("GET", "/cdn/")) == 3


def test_dropped_every_time(hub, model, tmp_path):
    hub.faults[SAFE] = {"drop_after": 0, "times": 1000}
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", ok=False)
    assert SAFE in r.stderr and "pull again to resume" in r.stderr
    assert not (repo_dir(tmp_path) / "snapshots" / COMMIT / SAFE).exists()
    sha = hashlib.sha256(model[1][SAFE]).hexdigest()
    assert not (repo_dir(tmp_path) / "blobs" / sha).exists()
    # the next pull, against a healthy server, finishes it
    hub.faults.clear()
    pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    check_snapshot(tmp_path, model[1])


def test_corrupted_download(hub, model, tmp_path):
    hub.faults[SAFE] = {"corrupt": True}
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", ok=False)
    sha = hashlib.sha256(model[1][SAFE]).hexdigest()
    assert "corrupted download" in r.stderr and SAFE in r.stderr and sha in r.stderr
    blobs = os.listdir(repo_dir(tmp_path) / "blobs")
    assert sha not in blobs and sha + ".incomplete" not in blobs
    assert not (repo_dir(tmp_path) / "snapshots" / COMMIT / SAFE).exists()
    hub.faults["config.json"] = {"corrupt": True}  # a small (git blob) file too
    hub.faults.pop(SAFE)
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", "--include", "config.json", env={"HF_HUB_CACHE": str(tmp_path / "hub2")}, ok=False)
    assert "corrupted download" in r.stderr and "git blob id" in r.stderr


def test_not_found(hub, tmp_path):
    r = pull(hub, tmp_path, "tiny-org/absent", ok=False)
    assert "tiny-org/absent@main" in r.stderr and "404" in r.stderr
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3@v9", ok=False)
    assert "no such repo or revision" in r.stderr
    hub.faults["tokenizer.json"] = {"missing": True}
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", ok=False)
    assert "tokenizer.json" in r.stderr and "404" in r.stderr


def test_private_needs_token(hub, model, tmp_path):
    r = pull(hub, tmp_path, "tiny-org/private", ok=False)
    assert "401" in r.stderr and "HF_TOKEN" in r.stderr
    r = pull(hub, tmp_path, "tiny-org/private", env={"HF_TOKEN": "wrong"}, ok=False)
    assert "401" in r.stderr and "not accepted" in r.stderr
    pull(hub, tmp_path, "tiny-org/private", env={"HF_TOKEN": hub.token})
    check_snapshot(tmp_path, model[1], repo="tiny-org/private")
    # the token file of `huggingface-cli login` works too
    (tmp_path / "hfhome").mkdir()
    (tmp_path / "hfhome" / "token").write_text(hub.token + "\n")
    pull(hub, tmp_path, "tiny-org/private", env={"HF_HOME": str(tmp_path / "hfhome")})


def test_token_never_sent_to_the_cdn(hub, tmp_path):
    pull(hub, tmp_path, "tiny-org/private", env={"HF_TOKEN": hub.token})
    cdn, ours = hub.requests(prefix="/cdn/"), hub.requests(prefix="/api/") + hub.requests(prefix="/tiny-org/")
    assert cdn and all(q["auth"] is None for q in cdn)
    assert ours and all(q["auth"] == f"Bearer {hub.token}" for q in ours)


def test_renamed_repo(hub, model, tmp_path):
    hub.repos["old-org/tiny-qwen3"] = hub.repos["tiny-org/tiny-qwen3"]  # the listing answers; resolve redirects
    hub.renamed["old-org/tiny-qwen3"] = "tiny-org/tiny-qwen3"
    pull(hub, tmp_path, "old-org/tiny-qwen3")
    check_snapshot(tmp_path, model[1], repo="old-org/tiny-qwen3")


def test_offline(hub, model, tmp_path):
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", env={"HF_HUB_OFFLINE": "1"}, ok=False)
    assert "HF_HUB_OFFLINE" in r.stderr and not hub.log
    pull(hub, tmp_path, "tiny-org/tiny-qwen3")
    n = len(hub.log)
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", env={"HF_HUB_OFFLINE": "1"})
    assert len(hub.log) == n and r.stdout.strip().endswith(COMMIT)


@pytest.mark.parametrize("evil", ["../escape.txt", "/etc/passwd", "a/../../b", "sub//x", "sub/./x", "back\\slash"])
def test_hostile_file_names(hub, tmp_path, evil):
    hub.repos["tiny-org/tiny-qwen3"].files[evil] = b"x"
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", ok=False)
    assert "not a plain relative path" in r.stderr
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "hub" / "escape.txt").exists()


def test_bad_arguments(hub, tmp_path):
    r = pull(hub, tmp_path, "not-a-repo-id", ok=False)
    assert "repo id" in r.stderr
    r = pull(hub, tmp_path, "tiny-org/tiny-qwen3", env={"HF_ENDPOINT": "ftp://x"}, ok=False)
    assert "HF_ENDPOINT" in r.stderr
