"""Training and evaluation prompts from material on this machine (no download):

* debian: Debian package descriptions (`apt-cache dumpavail`, after `apt-get update`), asked
  about in several ways (chat / explanation);
* python: the Python standard library: "explain this function", "write a function that ..."
  from docstrings and signatures, "explain this code" from source (code);
* written: prompts written for this project (general chat, advice, stories, how-tos).

Every prompt gets a split by a hash of its text (about 3% held out, never trained on); the eval
set also holds bench/prompts' chat and copy-heavy sets (only in eval). Deterministic for a given
apt list and Python version.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import inspect
import json
import os
import random
import subprocess
import textwrap
import warnings

STDLIB_MODULES = [
    "argparse", "base64", "bisect", "calendar", "collections", "colorsys", "configparser", "csv",
    "datetime", "difflib", "email.utils", "enum", "fnmatch", "fractions", "functools", "getopt",
    "glob", "gzip", "hashlib", "heapq", "html", "http.cookies", "ipaddress", "itertools", "json",
    "logging", "mimetypes", "operator", "os.path", "pathlib", "pprint", "queue", "random", "re",
    "sched", "secrets", "shlex", "shutil", "statistics", "string", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "tokenize", "traceback", "typing", "urllib.parse", "uuid",
    "wave", "zipfile", "zlib", "inspect", "ast", "dataclasses", "contextlib", "copy", "decimal",
    "locale", "numbers", "platform", "plistlib", "quopri", "sqlite3", "struct", "subprocess",
    "sysconfig", "tomllib", "unicodedata", "weakref", "xml.dom.minidom", "zoneinfo",
]

_TOPICS = [
    "learning a new language", "saving money", "starting to run", "growing tomatoes", "keeping a journal",
    "writing a cover letter", "public speaking", "cooking rice", "planning a trip to Japan",
    "organising a small library", "training a puppy", "reading more books", "staying focused at work",
    "making friends in a new city", "learning to play the guitar", "fixing a flat bicycle tire",
    "baking bread", "taking better photos", "decluttering a flat", "preparing for an exam",
    "brewing coffee", "camping in the rain", "painting a room", "teaching a child to swim",
    "reducing food waste", "building a birdhouse", "recycling electronics", "choosing a laptop",
    "writing a haiku", "hosting a dinner party", "meditating", "negotiating a salary",
]
_CONCEPTS = [
    "photosynthesis", "inflation", "the water cycle", "black holes", "vaccines", "compound interest",
    "plate tectonics", "the French Revolution", "machine learning", "DNS", "public key cryptography",
    "supply and demand", "the immune system", "gravity", "democracy", "recursion", "the greenhouse effect",
    "evolution", "blockchains", "the Roman Empire", "climate and weather", "electric cars", "antibiotics",
    "the stock market", "volcanoes", "rainbows", "tides", "the printing press", "jazz", "sleep",
    "hash tables", "the internet", "nuclear fusion", "bees", "the Silk Road", "languages and dialects",
]
_WRITING = [
    "a short story about a robot who learns to paint", "a poem about the sea",
    "a letter to a friend who moved abroad", "a product description for a reusable water bottle",
    "a short speech for a school graduation", "a limerick about a cat",
    "a dialogue between a teacher and a student about honesty", "a fairy tale set in a forest",
    "a news report about a town festival", "a diary entry of a lighthouse keeper",
    "a recipe for vegetable soup", "an email asking for a deadline extension",
    "a review of an imaginary restaurant", "a short mystery story", "a motivational message for a team",
    "instructions for assembling a bookshelf", "a haiku sequence about the seasons",
]
_CHAT_TEMPLATES = [
    "Give me five tips for {t}.", "How do I get better at {t}?", "What are common mistakes when {t}?",
    "Explain {c} to a ten-year-old.", "What is {c}? Explain it in a few paragraphs.",
    "Write {w}.", "Summarise the main ideas of {c}.", "Compare {c} and {c2}.",
    "What are the pros and cons of {t}?", "Write a step-by-step guide to {t}.",
]


def _split(text: str, eval_pct: float) -> str:
    h = int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)
    return "eval" if (h % 10000) < eval_pct * 100 else "train"


def debian_prompts(limit: int, rng: random.Random) -> list[dict]:
    try:
        txt = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    pkgs = []
    for stanza in txt.split("\n\n"):
        f = {}
        for line in stanza.split("\n"):
            if ": " in line and not line.startswith(" "):
                k, v = line.split(": ", 1)
                f[k] = v.strip()
        name, desc = f.get("Package"), f.get("Description") or f.get("Description-en")
        if name and desc and not name.endswith(("-dbg", "-dbgsym", "-doc", "-dev", "-data")):
            deps = ", ".join(d.split(" ")[0] for d in f.get("Depends", "").split(", ")[:4] if d)
            pkgs.append((name, desc, f.get("Section", "misc"), deps))
    pkgs = sorted(set(pkgs))
    rng.shuffle(pkgs)
    # bookworm's Packages files carry the one-line summary only (long texts are in Translation
    # files that apt does not fetch here)
    forms = [
        "What is the Debian package {n} for? Its summary is: {s}.",
        "Explain in simple words what a program described as \"{s}\" does, and who would use it.",
        "I found a program called {n} ({s}). When would I use it?",
        "Write a short introduction for new users of {n}, which is \"{s}\".",
        "The Debian package {n} is in the {sec} section and depends on {d}. Summary: {s}. "
        "What can you tell me about it?",
        "Give three ideas for how someone could use {n} ({s}).",
    ]
    out = []
    for i, (n, s, sec, d) in enumerate(pkgs[:limit]):
        out.append({"source": "debian", "text": forms[i % len(forms)].format(
            n=n, s=s, sec=sec, d=d or "nothing else")})
    return out


def python_prompts(limit: int, rng: random.Random) -> list[dict]:
    items = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in STDLIB_MODULES:
            try:
                mod = importlib.import_module(modname)
            except ImportError:
                continue
            for name, obj in sorted(vars(mod).items()):
                if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                if getattr(obj, "__module__", "") != mod.__name__:
                    continue
                doc = inspect.getdoc(obj) or ""
                try:
                    src = inspect.getsource(obj)
                except (OSError, TypeError):
                    src = ""
                items.append((modname, name, doc, src))
    rng.shuffle(items)
    out = []
    for i, (m, n, doc, src) in enumerate(items):
        first = doc.split("\n\n")[0].replace("\n", " ").strip()
        kind = i % 3
        if kind == 0 and src and len(src) < 2500:
            text = f"Explain what this Python code does:\n\n```python\n{textwrap.dedent(src)}```"
        elif kind == 1 and first:
            text = f"Write a Python function called `{n}` that does the following: {first}"
        elif first:
            text = f"What does `{m}.{n}` do in Python? The documentation says: {first}"
        else:
            continue
        out.append({"source": "python", "text": text})
        if len(out) >= limit:
            break
    return out


def written_prompts(rng: random.Random) -> list[dict]:
    out = []
    for tpl in _CHAT_TEMPLATES:
        for i in range(max(len(_TOPICS), len(_CONCEPTS), len(_WRITING))):
            out.append({"source": "written", "text": tpl.format(
                t=_TOPICS[i % len(_TOPICS)], c=_CONCEPTS[i % len(_CONCEPTS)],
                c2=_CONCEPTS[(i * 7 + 3) % len(_CONCEPTS)], w=_WRITING[i % len(_WRITING)])})
    uniq = {p["text"]: p for p in out}
    out = list(uniq.values())
    rng.shuffle(out)
    return out


def bench_prompts(root: str) -> list[dict]:
    out = []
    for kind in ("chat", "copy"):
        for path in sorted(glob.glob(os.path.join(root, "bench", "prompts", kind, "*.json"))):
            with open(path, encoding="utf-8") as f:
                ctx = json.load(f)
            out.append({"source": f"bench-{kind}", "messages": ctx["messages"], "split": "eval",
                        "name": os.path.basename(path)[:-5]})
    return out


def build(root: str, n_debian: int, n_python: int, eval_pct: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    prompts = debian_prompts(n_debian, rng) + python_prompts(n_python, rng) + written_prompts(rng)
    for p in prompts:
        p["split"] = _split(p["text"], eval_pct)
        p["messages"] = [{"role": "user", "content": p.pop("text")}]
    prompts += bench_prompts(root)
    rng.shuffle(prompts)
    for i, p in enumerate(prompts):
        p["id"] = i
    return prompts
