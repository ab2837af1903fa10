"""tok/nfc (the NFC normalizer of tokenizer.json) vs Python's unicodedata.normalize("NFC", ...).

* every code point alone, after a base letter and before combining marks (three strings each), when
  this Python's Unicode version is the one src/tok/nfc_table.h was generated from (skipped visibly
  otherwise: newer versions assign new characters);
* the 2,420 strings of the tokenizer corpus, and targeted cases: Hangul (L V T jamo, LV + T),
  combining sequences out of order and blocked, singletons, composition exclusions, non-starter
  decompositions, and all of those concatenated.
The tokenizer with an NFC normalizer is checked against the `tokenizers` package in test_tok_hf.py.
"""

import json
import os
import re
import subprocess
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("DSP_BUILD_DIR", os.path.join(ROOT, "build", "release"))
TABLE = os.path.join(ROOT, "src", "tok", "nfc_table.h")
CORPUS = os.path.join(ROOT, "tests", "fixtures", "tok", "corpus.jsonl")

TARGETED = [
    "e\u0301", "E\u0300\u0323", "a\u0301\u0316", "a\u0316\u0301", "a\u0301\u0301", "\u0301\u0316x", "s\u0307\u0323", "s\u0323\u0307",
    "\u1112\u1161\u11ab", "\u1100\u1161", "\uac00\u11a8", "\uac01\u11a8", "\u1100\u1100\u1161\u11a8\u11a8", "\u1100\u0301\u1161",
    "\u212b", "\u2126", "\u212a", "\uf900", "\U0002f800", "\u0958", "\u0344", "\u0f73", "\u0f75", "\u1f82", "\u1fc1\u0345",
    "\u00c5\u0301", "A\u030a\u0301", "\u0041\u0328\u0301", "\u03b1\u0313\u0300\u0345", "\u0931", "\u0928\u093c",
    "\U0001d15e", "\U0001d160", "\u0b47\u0b3e", "\u0bc6\u0bbe\u0bd7", "\u0cbf\u0cd5", "\u1025\u102e", "\u3099\u304b\u3099",
    "\u304b\u3099\u309a", "\u1b05\u1b35", "\U000110a5\U000110ba", "a" + "\u0300\u0316" * 40, "\u0345" * 3 + "\u0300",
    "日本語のテキスト", "한국어 문장입니다.", "ｆｕｌｌｗｉｄｔｈ", "caf\u00e9 cafe\u0301", "",
]


def run_nfc(strings):
    tool = os.path.join(BUILD, "tests", "nfc_check")
    data = "".join(s.encode("utf-8").hex() + "\n" for s in strings)
    r = subprocess.run([tool], input=data, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")[:-1]
    assert len(lines) == len(strings)
    return [bytes.fromhex(l).decode("utf-8") if not l.startswith("!") else l for l in lines]


def compare(strings):
    got = run_nfc(strings)
    bad = [(s, g) for s, g in zip(strings, got) if g != unicodedata.normalize("NFC", s)]
    for s, g in bad[:10]:
        print(f"NFC({s.encode('unicode_escape')!r}) = {g.encode('unicode_escape')!r}, "
              f"want {unicodedata.normalize('NFC', s).encode('unicode_escape')!r}")
    assert not bad, f"{len(bad)} of {len(strings)} strings differ from unicodedata"


def test_targeted():
    compare(TARGETED + ["".join(TARGETED), " ".join(TARGETED)])


def test_corpus():
    strings = []
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            c = json.loads(line)
            strings.append(c["text"] if "text" in c else bytes.fromhex(c["hex"]).decode("utf-8", "replace"))
    assert len(strings) >= 2000 and sum(unicodedata.normalize("NFC", s) != s for s in strings) > 50
    compare(strings)
    compare([unicodedata.normalize("NFD", s) for s in strings])  # every composition in the corpus, undone


def test_every_code_point():
    version = re.search(r'DSP_NFC_UNICODE_VERSION "([0-9.]+)"', open(TABLE, encoding="ascii").read()).group(1)
    if version != unicodedata.unidata_version:
        pytest.skip(f"the table is Unicode {version}, this Python's unicodedata {unicodedata.unidata_version}: "
                    "new characters would differ (tools/gen_nfc_table.py regenerates it)")
    step = 7 if os.environ.get("DSP_SANITIZED") else 1  # sanitized builds: every 7th code point
    cps = [cp for cp in range(0, 0x110000, step) if not 0xD800 <= cp <= 0xDFFF]
    strings = []
    for cp in cps:
        c = chr(cp)
        strings += [c, "a" + c + "\u0301\u0316", c + "\u0308"]
    compare(strings)
