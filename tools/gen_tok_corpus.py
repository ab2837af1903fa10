#!/usr/bin/env python3
"""Generate the tokenizer test corpus: tests/fixtures/tok/corpus.jsonl.

Deterministic (seeded, standard library only). One JSON object per line:
  {"i": index, "cat": category, "text": str}            -- valid Unicode text
  {"i": index, "cat": "invalid_utf8", "hex": "..."}     -- raw bytes that are not valid UTF-8
Strings never contain lone surrogates (they are not representable as UTF-8, and the Hugging Face
tokenizers refuse them). Invalid byte strings are tokenized by the oracle as
bytes.decode("utf-8", "replace"), which is how dspark documents their handling.

usage: tools/gen_tok_corpus.py [--out PATH] [--seed N]
"""
import argparse
import json
import random

WORDS = ("the of and to in is was for that with as on by at from his her they this be which or "
         "are have had not but were one all their there been has more when who will would can if "
         "about into than them some could these two may first then do any like my now over such "
         "our man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people how too little state good very "
         "make world still own see men work long get here between both life being under never day "
         "same another know while last might us great old year off come since against go came right "
         "used take three tokenizer speculative decoding lossless inference engine throughput latency "
         "I'm you're we've they'll she'd it's don't can't won't isn't O'Neil rock'n'roll").split()

CODE = [
    "int main(int argc, char **argv) {\n    printf(\"%d\\n\", argc);\n    return 0;\n}\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (let i = 0; i < arr.length; i++) { console.log(`item ${i}: ${arr[i]}`); }",
    "fn main() -> Result<(), Box<dyn Error>> {\n\tlet v: Vec<u8> = vec![1, 2, 3];\n\tOk(())\n}",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<!DOCTYPE html>\n<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\\u00e9\"}}",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\nstatic const char *s = \"\\t\";",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # shape (3, 4)\nprint(x.sum())",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, 世界\")\n}\n",
    "public static void main(String[] args) throws IOException { List<String> l = new ArrayList<>(); }",
    "    if (x != NULL && x->next) {\n        x = x->next;  /* advance */\n    }\n",
    "$ ls -la | grep '^d' | awk '{print $9}' > dirs.txt && echo \"done: $?\"",
    "const f = async (a, b) => { await fetch(`/api/${a}?q=${encodeURIComponent(b)}`); };",
    "matrix = [[1, 2, 3],\n          [4, 5, 6]]\nassert matrix[1][2] == 6, 'bad'\n",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;k&&l||!m;",
    "x = lambda *args, **kw: (args, kw)\n@decorator(arg='v')\nclass Foo(Base, metaclass=Meta): pass",
    "ffffffff 0x1F2e3D 0b1010 0o777 1_000_000 3.14159e-10 .5 5. -0.0 +inf NaN",
]

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today? I'm fine, thanks.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong said: \"That's one small step...\"",
    "She said, 'It's 3:45 p.m.' -- but it was actually 4:15.",
    "E-mail me at someone@example.com or visit https://example.org/path?a=1&b=2#frag.",
    "Prices: $19.99, EUR 5,00, 1,234,567.89 units; 50% off!!!",
    "Mr. O'Neil's dog can't swim; they've tried. WE'LL SEE, YOU'D THINK, HE'S SURE.",
]

UNICODE = {
    "cjk": ["日本語のテキストです。", "我爱北京天安门，天安门上太阳升。", "한국어 문장입니다.", "漢字かなカナ混じり文",
            "中文，标点符号！“引号”《书名》", "ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ１２３"],
    "emoji": ["🦙", "😀😃😄", "👨‍👩‍👧‍👦", "👍🏽", "🇫🇷🇯🇵", "❤️", "🏳️‍🌈", "1️⃣", "🤖 robots 🤖", "🧑🏿‍💻"],
    "combining": ["e\u0301", "a\u0300\u0301\u0302", "n\u0303o", "Zalgo: Z\u0351\u0345a\u0346l\u0310g\u0357o",
                  "\u0915\u094d\u0937", "ก\u0e34\u0e48", "Ǆ ǅ ǆ ﬁ ﬀ"],
    "rtl": ["مرحبا بالعالم", "שלום עולם", "العربية 123 English", "\u202eevil\u202c text", "فارسی ۱۲۳۴"],
    "other_scripts": ["Привет, мир!", "Γειά σου Κόσμε", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Բարեւ", "ሰላም", "Ελληνικά",
                      "Führer größer Straße", "naïve café résumé", "ⅷ Ⅻ ½ ¼ ² ³ ₁₂ ①②"],
    "unicode_space": ["a\u00a0b", "a\u3000b", "a\u2028b", "a\u2029b", "a\u0085b", "a\u000bb", "a\u000cb",
                      "a\u200bb", "a\u2009b", "\ufeffbom", "a\u180eb", "a\u1680b", "tab\there"],
}

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
            "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "<|im_start", "im_end|>", "<0x41>", "<|",
            "<start_of_image>", "<unused0>", "[multimodal]", "<|fim_prefix|>", "<|repo_name|>"]


def ws_run(rng):
    return "".join(rng.choice([" ", " ", " ", "\t", "\n", "\r\n", "\r"]) for _ in range(rng.randint(1, 12)))


def sentence(rng, n=None):
    n = n or rng.randint(3, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    if rng.random() < 0.2:
        words[rng.randrange(n)] = words[rng.randrange(n)].upper()
    return " ".join(words) + rng.choice([".", "!", "?", ",", ";", ":", "", "..."])


def number(rng):
    k = rng.randint(0, 6)
    if k == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 20)))
    if k == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if k == 2:
        return f"{rng.randint(1, 999):,}" + "," + f"{rng.randint(0, 999):03d}"
    if k == 3:
        return f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if k == 4:
        return f"{rng.uniform(0, 1):.3e}"
    if k == 5:
        return "v" + ".".join(str(rng.randint(0, 20)) for _ in range(3))
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))


def mixed(rng):
    parts = []
    for _ in range(rng.randint(2, 8)):
        c = rng.randint(0, 7)
        if c == 0:
            parts.append(sentence(rng))
        elif c == 1:
            parts.append(number(rng))
        elif c == 2:
            parts.append(ws_run(rng))
        elif c == 3:
            parts.append(rng.choice(rng.choice(list(UNICODE.values()))))
        elif c == 4:
            parts.append(rng.choice(CODE)[: rng.randint(5, 80)])
        elif c == 5:
            parts.append(rng.choice(SPECIALS))
        elif c == 6:
            parts.append(rng.choice(PROSE))
        else:
            parts.append("".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                                 rng.randint(0x3000, 0x9fff), rng.randint(0x1f300, 0x1faff)]))
                                 for _ in range(rng.randint(1, 10))))
    sep = rng.choice(["", " ", "\n", "  "])
    return sep.join(parts)


def random_unicode(rng):
    out = []
    for _ in range(rng.randint(1, 30)):
        while True:
            cp = rng.choice([rng.randint(0, 0x7f), rng.randint(0x80, 0x7ff), rng.randint(0x800, 0xffff),
                             rng.randint(0x10000, 0x10ffff)])
            if not 0xd800 <= cp <= 0xdfff:
                break
        out.append(chr(cp))
    return "".join(out)


def invalid_bytes(rng):
    base = rng.choice([sentence(rng), rng.choice(PROSE), "日本語", "🦙x", ""]).encode()
    bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xe6\x97", b"\xf0\x9f\xa6", b"\x80", b"\xed\xa0\x80",
                      b"\xf4\x90\x80\x80", b"\xc3", b"\xfe\xfe", b"\xe2\x28\xa1", b"\xf8\x88\x80\x80\x80"])
    pos = rng.randint(0, len(base))
    data = base[:pos] + bad + base[pos:]
    if rng.random() < 0.3:
        data = data + rng.choice([b"\xe6", b"\xf0\x9f", b"\xc3"])
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/tok/corpus.jsonl")
    ap.add_argument("--seed", type=int, default=20250220)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    items = []

    def add(cat, text):
        items.append({"cat": cat, "text": text})

    # fixed edge cases first
    for s in ["", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", " \n ", "\r\n", "a", "A", "'s", "'S",
              "don't", "DON'T", "Hello world", " Hello world", "Hello World", " Hello World!", "Hello, world!",
              " this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български", "ied 4 ½ months", "Führer",
              "3", "33", "333", "3333", "33333", "333333", "3333333", "33333333", "333333333",
              "Cửa Việt", " discards", "\u00a0", "\u3000", "▁", "▁▁hello", "<0x0A>", "x\ufffdy"]:
        add("edge", s)
    for s in SPECIALS:
        add("special", s)
        add("special", f"{s}user\nhello{s}")
        add("special", f" {s} ")
    for cat, lst in UNICODE.items():
        for s in lst:
            add(cat, s)
    for s in CODE:
        add("code", s)
    for s in PROSE:
        add("prose", s)

    gens = [
        ("prose", lambda: " ".join(sentence(rng) for _ in range(rng.randint(1, 6)))),
        ("prose_long", lambda: " ".join(sentence(rng, 20) for _ in range(rng.randint(10, 30)))),
        ("code", lambda: rng.choice(CODE) + (ws_run(rng) + rng.choice(CODE) if rng.random() < 0.5 else "")),
        ("whitespace", lambda: ws_run(rng) + rng.choice(["", "x", "word", "1"]) + ws_run(rng) + rng.choice(["", "y"])),
        ("numbers", lambda: " ".join(number(rng) for _ in range(rng.randint(1, 5)))),
        ("cjk", lambda: "".join(rng.choice(UNICODE["cjk"]) for _ in range(rng.randint(1, 4)))),
        ("emoji", lambda: rng.choice(["", " ", "x"]).join(rng.choice(UNICODE["emoji"]) for _ in range(rng.randint(1, 5)))),
        ("combining", lambda: rng.choice(UNICODE["combining"]) + rng.choice(["", " ", "abc"]) + rng.choice(UNICODE["combining"])),
        ("rtl", lambda: rng.choice(UNICODE["rtl"]) + " " + sentence(rng, 3)),
        ("other_scripts", lambda: " ".join(rng.choice(UNICODE["other_scripts"]) for _ in range(rng.randint(1, 3)))),
        ("unicode_space", lambda: rng.choice(UNICODE["unicode_space"]) + ws_run(rng) + rng.choice(UNICODE["unicode_space"])),
        ("special", lambda: rng.choice(SPECIALS) + sentence(rng) + rng.choice(["", " ", "\n"]) + rng.choice(SPECIALS)),
        ("mixed", lambda: mixed(rng)),
        ("random_unicode", lambda: random_unicode(rng)),
    ]
    weights = [20, 2, 12, 10, 10, 5, 5, 4, 4, 5, 4, 8, 25, 10]
    while len(items) < 2300:
        cat, fn = rng.choices(gens, weights)[0]
        add(cat, fn())
    for _ in range(120):
        items.append({"cat": "invalid_utf8", "hex": invalid_bytes(rng).hex()})

    with open(args.out, "w", encoding="utf-8") as f:
        for i, it in enumerate(items):
            f.write(json.dumps({"i": i, **it}, ensure_ascii=False) + "\n")
    print(f"wrote {len(items)} strings to {args.out}")


if __name__ == "__main__":
    main()
