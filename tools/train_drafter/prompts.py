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
    # added for the second training recipe (more chat: the held-out chat set was the weakest)
    "learning to code", "sleeping better", "drinking more water", "starting a vegetable garden",
    "writing a novel", "moving to a new flat", "caring for a cat", "buying a used car",
    "preparing for a job interview", "learning to draw", "keeping houseplants alive", "cycling to work",
    "making sourdough", "studying for a math test", "managing stress", "starting a small business",
    "planning a wedding", "learning chess", "organising a kitchen", "running a marathon",
    "writing a resume", "choosing a first pet", "learning to swim as an adult", "saving energy at home",
    "hiking in the mountains", "teaching a teenager to drive", "giving feedback to a colleague",
    "working from home", "cooking for a large family", "keeping bees", "making pasta from scratch",
    "learning to type faster", "planning a birthday party", "staying safe online", "writing clear emails",
    "studying history", "doing yoga at home", "making a budget", "cleaning a bathroom",
    "learning to sew", "volunteering in the community", "travelling on a small budget",
    "building a personal website", "preparing for winter", "repairing a leaking tap", "making candles",
    "journaling for mental health", "picking a good book", "starting a podcast", "playing the piano",
    "learning photography", "making new habits stick", "being a better listener", "packing for a long trip",
    "keeping a car in good shape", "growing herbs on a balcony", "planning meals for a week",
    "making a short film", "learning to knit", "moving abroad", "raising chickens", "choosing running shoes",
]
_CONCEPTS = [
    "photosynthesis", "inflation", "the water cycle", "black holes", "vaccines", "compound interest",
    "plate tectonics", "the French Revolution", "machine learning", "DNS", "public key cryptography",
    "supply and demand", "the immune system", "gravity", "democracy", "recursion", "the greenhouse effect",
    "evolution", "blockchains", "the Roman Empire", "climate and weather", "electric cars", "antibiotics",
    "the stock market", "volcanoes", "rainbows", "tides", "the printing press", "jazz", "sleep",
    "hash tables", "the internet", "nuclear fusion", "bees", "the Silk Road", "languages and dialects",
    # added for the second training recipe
    "the moon's phases", "earthquakes", "the human heart", "electricity", "magnets", "the seasons",
    "the theory of relativity", "DNA", "viruses and bacteria", "solar panels", "wind power", "the ozone layer",
    "the Industrial Revolution", "ancient Egypt", "the Renaissance", "the Cold War", "the Olympic Games",
    "the periodic table", "atoms", "light and colour", "sound waves", "the speed of light", "clouds",
    "hurricanes", "glaciers", "deserts", "rainforests", "coral reefs", "the food chain", "dinosaurs",
    "the solar system", "stars", "galaxies", "satellites", "GPS", "computers", "operating systems",
    "databases", "encryption", "passwords", "algorithms", "sorting algorithms", "binary numbers",
    "the cloud", "open source software", "version control", "compilers", "neural networks",
    "interest rates", "taxes", "banks", "credit cards", "insurance", "unemployment", "trade",
    "globalisation", "cities", "architecture", "bridges", "trains", "airplanes", "rockets", "the wheel",
    "writing systems", "music theory", "poetry", "theatre", "photography", "impressionism", "philosophy",
    "ethics", "memory", "emotions", "habits", "nutrition", "vitamins", "exercise", "the brain", "the eyes",
    "allergies", "fever", "probability", "statistics", "prime numbers", "geometry", "fractions",
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
    # added for the second training recipe
    "a poem about autumn", "a short story about a dragon who is afraid of fire", "a thank-you note to a teacher",
    "a bedtime story about a sleepy owl", "a short story about a time traveller", "a poem about the city at night",
    "an invitation to a garden party", "a short biography of an imaginary inventor", "a song about friendship",
    "a story about a lost dog finding its way home", "a letter of complaint about a late train",
    "a welcome message for new club members", "a short play about two neighbours", "a poem about rain",
    "a description of a busy market", "a story that begins with a knock at the door",
    "an advertisement for a bicycle repair shop", "a toast for a friend's wedding",
    "a short science fiction story set on Mars", "a letter from a cat to its owner",
    "a weather forecast for a magical kingdom", "a blog post about a first day at a new job",
    "a short story about a baker and a mysterious customer", "a travel guide entry for a small island",
    "a poem about a mountain", "a short fable with a moral", "a story about a child who finds a map",
    "a product review of a pair of headphones", "a note apologising for missing a meeting",
]
_CHAT_TEMPLATES = [
    "Give me five tips for {t}.", "How do I get better at {t}?", "What are common mistakes when {t}?",
    "Explain {c} to a ten-year-old.", "What is {c}? Explain it in a few paragraphs.",
    "Write {w}.", "Summarise the main ideas of {c}.", "Compare {c} and {c2}.",
    "What are the pros and cons of {t}?", "Write a step-by-step guide to {t}.",
]
# the second recipe's chat prompts: every template with every subject of its kind
_MORE_TEMPLATES = {
    "t": ["I want to start {t}. Where should I begin?", "Can you help me with {t}?",
          "What should a beginner know about {t}?", "Make a simple plan for {t} over the next month.",
          "My friend is struggling with {t}. What advice can I give?",
          "Why do people find {t} hard, and how can it be made easier?"],
    "c": ["How does {c} work?", "Why is {c} important?", "Tell me three interesting facts about {c}.",
          "Explain {c} in one paragraph.", "What is a common misunderstanding about {c}?",
          "How would you teach {c} to a beginner?", "Give a simple example of {c}."],
    "w": ["Please write {w}.", "Could you write {w}? Keep it short.", "Write {w} for a young reader."],
}

# the seventh recipe's chat prompts: more subjects and more ways of asking, every template (the
# second recipe's too) with every subject of its kind (~10 k prompts; the greedy answers to them
# were the data that raised held-out chat acceptance the most)
_TOPICS_V7 = [
    "learning a second instrument", "writing a thesis", "running a book club", "becoming a morning person",
    "travelling with children", "getting started with woodworking", "learning to cook Indian food",
    "preparing a presentation", "living with roommates", "keeping an aquarium", "learning sign language",
    "writing poetry", "improving handwriting", "learning to dance", "becoming a better writer",
    "quitting sugar", "planning a road trip", "mentoring a junior colleague", "learning to juggle",
    "organising digital photos", "repairing old furniture", "growing a lemon tree indoors",
    "learning to skateboard", "building a gaming PC", "teaching an old dog new tricks", "making soap",
    "brewing tea properly", "starting a compost heap", "speaking up in meetings", "learning a programming language",
    "saving for a house", "paying off debt", "finding a hobby", "coping with homesickness",
    "preparing for a marathon in hot weather", "studying abroad", "learning to ski", "writing a song",
    "cooking vegetarian meals", "keeping a tidy desk", "getting better at maths", "learning to meditate",
    "fixing a slow computer", "choosing a bicycle", "planting a tree", "making friends as an adult",
    "visiting a museum with kids", "writing a speech", "learning calligraphy", "hosting a board game night",
]
_CONCEPTS_V7 = [
    "tsunamis", "the northern lights", "the metric system", "money", "credit scores", "the Great Wall of China",
    "the Moon landing", "mitochondria", "proteins", "enzymes", "the nervous system", "bones", "muscles",
    "the digestive system", "fermentation", "batteries", "transistors", "the telephone", "radio", "television",
    "the steam engine", "the Internet of Things", "virtual reality", "robots", "self-driving cars",
    "artificial intelligence", "quantum computers", "spreadsheets", "email", "social media", "search engines",
    "copyright", "elections", "the United Nations", "human rights", "the Middle Ages", "the Vikings",
    "the Aztecs", "ancient Greece", "the Byzantine Empire", "the Ming dynasty", "the American Revolution",
    "the printing of money", "mortgages", "pensions", "index funds", "renewable energy", "nuclear power",
    "recycling", "biodiversity", "bird migration", "photosynthesis in algae", "soil", "rivers", "oceans",
    "mountains", "caves", "the Sahara", "the Amazon river", "Antarctica",
]
_WRITING_V7 = [
    "a poem about a lighthouse", "a short story about a brave mouse", "a letter to your future self",
    "a short speech for a retirement party", "a story about a village that loses its music",
    "a description of a winter morning", "a short story about two friends on a boat",
    "a poem about a grandmother's kitchen", "a cover letter for a library assistant job",
    "a short story about a detective cat", "an email inviting colleagues to a team lunch",
    "a children's story about sharing", "a short story set in a busy train station",
    "a poem about the first day of spring", "a review of a film about space", "a story about a magic umbrella",
    "a short story about a robot and a child", "a motivational speech for a football team",
    "a diary entry of an astronaut on the moon", "a story about a talking tree",
    "a complaint letter about a noisy neighbour", "a short story about finding a lost ring",
    "a poem about friendship", "a product description for a smart lamp", "a fable about a fox and a crow",
    "a short mystery set in a museum", "a thank-you letter to a nurse", "a story about a kite that flies away",
    "a description of a summer festival", "a short story about an inventor's first failure",
]
_V7_TEMPLATES = {
    "t": ["What are the first three steps for {t}?", "I keep failing at {t}. What am I doing wrong?",
          "Explain the basics of {t} in simple terms.", "What tools or things do I need for {t}?",
          "How long does it usually take to get good at {t}?", "Give me a checklist for {t}.",
          "What is the most important thing to remember about {t}?", "How can I make {t} more fun?",
          "What are some good habits for {t}?", "Can you give me a weekly routine for {t}?",
          "I have only 15 minutes a day. How can I make progress with {t}?",
          "What questions should I ask an expert about {t}?", "Tell me a short story about someone {t}.",
          "Write a short motivational message for someone {t}.", "What are three myths about {t}?",
          "How do I know if I am doing well at {t}?", "What should I avoid when {t}?",
          "Explain {t} to someone who has never tried it.", "How can two friends help each other with {t}?",
          "Summarise the best advice about {t} in five sentences."],
    "c": ["Can you explain {c} in simple words?", "What would happen if there were no {c}?",
          "Who discovered or invented {c}, and why does it matter?", "Explain {c} using an everyday analogy.",
          "What are the main parts of {c}?", "Write a short quiz with three questions about {c}.",
          "How has our understanding of {c} changed over time?", "What is the history of {c}?",
          "Describe {c} in three sentences.", "What questions do children often ask about {c}?",
          "What are the advantages and disadvantages of {c}?", "Give me a short summary of {c} for a school report.",
          "How is {c} connected to everyday life?", "What are some surprising things about {c}?",
          "Explain {c} to a high school student.", "What is the difference between {c} and something similar?",
          "List the key terms I should know about {c}, with short definitions.",
          "Why do some people find {c} confusing?", "Write a short paragraph about {c} for a blog.",
          "How would you explain {c} to your grandmother?", "What are the most important facts about {c}?",
          "I am writing an essay on {c}. What points should I include?"],
    "w": ["Write {w}. Use simple language.", "Can you please write {w}?", "I need {w}. Make it warm and friendly.",
          "Write {w} in about 100 words.", "Write {w} with a happy ending.", "Write {w} that a child could enjoy.",
          "Help me write {w}.", "Write {w}, and give it a title."],
}


def _written_cross() -> list[str]:
    subjects = {"t": _TOPICS, "c": _CONCEPTS, "w": _WRITING}
    old = [tpl.format(**{k: s}) for k, tpls in _MORE_TEMPLATES.items() for tpl in tpls for s in subjects[k]]
    more = {"t": _TOPICS_V7, "c": _CONCEPTS_V7, "w": _WRITING_V7}
    tpls = {k: _MORE_TEMPLATES[k] + _V7_TEMPLATES[k] for k in _MORE_TEMPLATES}
    return old + [tpl.format(**{k: s}) for k in tpls for tpl in tpls[k] for s in subjects[k] + more[k]]


def split_of(text: str, eval_pct: float) -> str:
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
    out += [{"source": "written", "text": t} for t in _written_cross()]
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
        p["split"] = split_of(p["text"], eval_pct)
        p["messages"] = [{"role": "user", "content": p.pop("text")}]
    prompts += bench_prompts(root)
    rng.shuffle(prompts)
    for i, p in enumerate(prompts):
        p["id"] = i
    return prompts
