"""`dspark chat` read from a pipe: /reset says what it did, and an error (a message longer than the
context) is reported on stderr without a stray empty line on stdout."""
import os
import subprocess

import pytest

from srvutil import BIN, MODEL

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason=MODEL + " absent (scripts/fetch-models)")


def chat(stdin, *args):
    return subprocess.run([BIN, "chat", "-m", MODEL, "--ctx", "64", "-n", "2", "--temperature", "0", *args],
                          input=stdin.encode(), capture_output=True, timeout=120)


def test_reset_and_overlong_error():
    p = chat("/reset\n" + "hello " * 200 + "\n")
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    assert "[new conversation]" in err
    assert "does not fit the context of 64 tokens" in err, err
    assert p.stdout == b"", p.stdout  # nothing was generated: no empty line either
    # a normal turn still prints its reply and one newline
    p = chat("Hi\n")
    assert p.returncode == 0 and p.stdout.endswith(b"\n") and p.stdout.strip(), p
