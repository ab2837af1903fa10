"""Oracle test for the chat template interpreter (src/template/).

Python jinja2, configured the way Hugging Face transformers' apply_chat_template configures it
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, {% generation %}, HF's tojson with
ensure_ascii=False, raise_exception, strftime_now, namespace, dict), renders each template with each
conversation in tests/fixtures/chat/; `dspark template` must print the same bytes. Where jinja2
raises, dspark must fail too (exit status != 0), and for raise_exception() with the same message.

Templates: SmolLM2's (read from the model file's tokenizer.chat_template), the ones committed under
tests/fixtures/templates/ (Qwen3, Gemma 3), and every template in $DSP_TESTDATA/chat-templates/.
Qwen3 runs once per enable_thinking setting (absent, true, false).
"""
import json
import os
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

DSPARK = os.environ.get("DSPARK_BIN")
FIXTURES = Path(os.environ.get("DSP_FIXTURES", Path(__file__).resolve().parents[1] / "fixtures"))
TESTDATA = os.environ.get("DSP_TESTDATA")
MODELS = os.environ.get("DSP_MODELS")
NOW = 1721995200  # 2024-07-26 12:00:00 UTC, passed to dspark as --now


# ------------------------------------------------------------------ the reference environment

class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers only records where)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class HFNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):  # same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for k in attrs:
            HFNamespace._check(k)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        HFNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {name!r}")


class HFDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def reference_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = HFDict()
    env.globals["namespace"] = HFNamespace
    return env


ENV = reference_env()


# ------------------------------------------------------------------ templates and conversations

def special_tokens(name):
    n = name.lower()
    if "smollm" in n or "qwen" in n or "hermes" in n:
        return {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    if "llama" in n and "deepseek" not in n or "functionary" in n or "firefunction" in n:
        return {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    if "gemma" in n:
        return {"bos_token": "<bos>", "eos_token": "<eos>"}
    if "deepseek" in n:
        return {"bos_token": "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "eos_token": "<\uff5cend\u2581of\u2581sentence\uff5c>"}
    if "cohere" in n:
        return {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"}
    if "phi" in n:
        return {"bos_token": "<s>", "eos_token": "<|endoftext|>"}
    return {"bos_token": "<s>", "eos_token": "</s>"}


def smollm2_template():
    if not MODELS:
        return None
    path = Path(MODELS) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        return None
    import gguf
    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def collect_templates():
    """(id, source, extra context variants) for every template; and reasons for skipped sources."""
    out, skipped = [], []
    src = smollm2_template()
    if src is None:
        skipped.append("SmolLM2 model file absent (DSP_MODELS)")
    else:
        out.append(("SmolLM2-135M-Instruct", src))
    for p in sorted((FIXTURES / "templates").glob("*.jinja")):
        out.append((p.stem, p.read_text(encoding="utf-8")))
    if TESTDATA and (Path(TESTDATA) / "chat-templates").is_dir():
        for p in sorted((Path(TESTDATA) / "chat-templates").glob("*.jinja")):
            out.append((p.stem, p.read_text(encoding="utf-8")))
    else:
        skipped.append("shared test data absent (DSP_TESTDATA/chat-templates)")
    return out, skipped


TEMPLATES, SKIPPED = collect_templates()
CONVERSATIONS = sorted((FIXTURES / "chat").glob("*.json"))


def variants(template_id):
    if "qwen3" in template_id.lower():
        return [("", {}), ("think-on", {"enable_thinking": True}), ("think-off", {"enable_thinking": False})]
    return [("", {})]


CASES = [(tid, src, conv, vname, extra)
         for tid, src in TEMPLATES for conv in CONVERSATIONS for vname, extra in variants(tid)]


def case_id(c):
    tid, _, conv, vname, _ = c
    return f"{tid}:{conv.stem}" + (f":{vname}" if vname else "")


def build_context(template_id, conv_path, extra):
    ctx = json.loads(conv_path.read_text(encoding="utf-8"))
    ctx.update(special_tokens(template_id))
    # transformers always passes tools and documents (None when not given)
    ctx.setdefault("tools", None)
    ctx.setdefault("documents", None)
    if "tool_use" in template_id and ctx["tools"] is None:
        ctx["tools"] = []  # these templates iterate `tools` unconditionally
    if "firefunction" in template_id:  # its own variables: the tool list as JSON text and a date
        ctx["functions"] = json.dumps(ctx["tools"] or [], ensure_ascii=False, indent=2)
        ctx["datetime"] = "Fri, 26 Jul 2024"
    ctx.update(extra)
    return ctx


def run_dspark(template_src, ctx):
    with tempfile.TemporaryDirectory() as d:
        t = Path(d) / "t.jinja"
        c = Path(d) / "ctx.json"
        t.write_bytes(template_src.encode("utf-8"))
        c.write_text(json.dumps(ctx, ensure_ascii=False), encoding="utf-8")
        return subprocess.run([DSPARK, "template", "-t", str(t), "--context", str(c), "--now", str(NOW)],
                              capture_output=True, timeout=60)


# ------------------------------------------------------------------ tests

needs_bin = pytest.mark.skipif(not DSPARK, reason="DSPARK_BIN not set (run through ctest)")


@needs_bin
def test_help():
    r = subprocess.run([DSPARK, "template", "--help"], capture_output=True, timeout=30)
    assert r.returncode == 0
    assert b"--context" in r.stdout


@needs_bin
def test_sources_present():
    if SKIPPED:
        pytest.skip("; ".join(SKIPPED))


@needs_bin
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_matches_jinja2(case):
    tid, src, conv, _, extra = case
    ctx = build_context(tid, conv, extra)
    try:
        expected = ENV.from_string(src).render(**ctx)
        expected_error = None
    except jinja2.exceptions.TemplateSyntaxError:
        raise
    except Exception as e:  # the template itself failed: dspark must fail too
        expected, expected_error = None, e
    r = run_dspark(src, ctx)
    err = r.stderr.decode("utf-8", "replace")
    if expected_error is not None:
        assert r.returncode != 0, f"jinja2 raised {type(expected_error).__name__}: {expected_error}, dspark printed:\n{r.stdout!r}"
        if type(expected_error) is jinja2.exceptions.TemplateError:  # raise_exception()
            assert str(expected_error) in err, f"raise_exception message missing from: {err}"
        return
    assert r.returncode == 0, f"dspark failed: {err}"
    got = r.stdout.decode("utf-8")
    if got != expected:
        # show where they part
        i = next((k for k in range(min(len(got), len(expected))) if got[k] != expected[k]), min(len(got), len(expected)))
        pytest.fail(f"mismatch at char {i}:\n jinja2: {expected[max(0, i - 80):i + 80]!r}\n dspark: {got[max(0, i - 80):i + 80]!r}")


# A few constructs the templates above do not reach, checked against jinja2 directly.
SNIPPETS = [
    "{{ [1, 'a', none, true, 1.5, (1,), {'k': [2]}] }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 / 3 }} {{ 1e20 }} {{ 0.00001 }}",
    "{{ 'abc'[::-1] }}{{ 'x' * 3 }}{{ [1,2,3][-1] }}{{ 'héllo'[1:3] }}{{ [1,2,3,4][1::2] }}",
    "{% for a, b in {'x': 1, 'y': 2}.items() %}{{ a }}={{ b }}{{ ', ' if not loop.last }}{% endfor %}",
    "{% for i in range(5) if i is odd %}{{ loop.index }}/{{ loop.length }}:{{ i }}{{ loop.previtem }} {% else %}none{% endfor %}",
    "{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
    "{% macro f(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, c=3) }}{{ f('x', 'y', 'z') }}",
    "{% set x %}  inner {{ 1 + 1 }}  {% endset %}[{{ x }}]{% filter upper %}abc{% endfilter %}",
    "{{ '  a b  '|trim }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'Hello World'|lower|title }}",
    "{{ {'b': 1, 'a': [1, 2, {'c': none}]}|tojson }}|{{ {'b': 1, 'a': []}|tojson(indent=2) }}|{{ 'é\"\\n'|tojson }}",
    "{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a']|unique|list }}{{ [{'n': 'x'}, {'n': 'y'}]|map(attribute='n')|join('-') }}",
    "{{ [1, 2, 3]|select('odd')|list }}{{ [{'t': 'a'}, {'t': 'b'}]|selectattr('t', 'equalto', 'b')|list }}",
    "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(3, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}",
    "{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 3 is divisibleby 3 }}",
    "{{ 'a' ~ 1 ~ none ~ 2.5 }}{{ 1 if false }}{{ 'y' if 0 else 'n' }}{{ [] or 'empty' }}{{ 'A' and 'B' }}",
    "{{ 1 == 1.0 }}{{ 'ab' in 'cabd' }}{{ 2 not in [1] }}{{ 1 < 2 < 3 }}{{ [1, 2] < [1, 3] }}",
    "{{ 'x'|safe + '<b>' }}|{{ '<i>'|e }}|{{ '42'|int + 1 }}|{{ '3.5'|float }}|{{ -3|abs }}|{{ 2.5|round }}",
    "  {% if true %}\n    kept\n  {% endif %}\n{%- if true -%}  trimmed  {%- endif %}\n{# c #}\n  {%+ if true %}x{% endif %}",
    "{{ 'ab'|replace('b', 'c') }}{{ 'aXbX'.replace('X', '-', 1) }}{{ 'Ab'.startswith(('x', 'A')) }}{{ 'x.y'.endswith('.y') }}",
    "{% raw %}{{ not rendered }}{% endraw %}{{ strftime_now('%Y-%m-%d %H:%M') }}",
    "{{ dict(a=1, b=2) }}{{ namespace(a=1).a }}{{ {'a': 1}.get('b', 'dflt') }}{{ {'a': 1}.keys()|list }}",
    "{% with y = 5 %}{{ y }}{% endwith %}{% generation %}gen{% endgeneration %}{{ 'abc'|first }}{{ [1,2]|last }}",
]


@needs_bin
@pytest.mark.parametrize("src", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_snippet_matches_jinja2(src):
    expected = ENV.from_string(src).render()
    r = run_dspark(src, {})
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode("utf-8") == expected
