"""Tool calling and reasoning through the official clients.

The default model (SmolLM2-135M) cannot call tools, so these tests run `dspark_scripted`, the
server's test-only twin (CMakeLists.txt): a request's "dspark_test_output" is emitted as if the
model had generated it — tokenized with the model's tokenizer and streamed token by token through
the same detokenizer, callback, parser and formatter as real output. What is tested is everything
between the HTTP request and the model (template rendering with tools, the family's call syntax
parsed back, ids, finish reasons, streaming deltas); what the model would say is scripted. The
templates come from ../shared/testdata/chat-templates (published model templates); tests skip
visibly when it is absent. The prompt the server renders is checked against Python jinja2
rendering the same template (the oracle), via its token count."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srvutil import BIN, MODEL, SCRIPTED_BIN, Server, error_of, post

pytestmark = pytest.mark.skipif(not (os.path.exists(MODEL) and os.path.exists(SCRIPTED_BIN)),
                                reason="model or dspark_scripted absent (scripts/fetch-models, scripts/build)")
openai = pytest.importorskip("openai")

TESTDATA = Path(os.environ.get("DSP_TESTDATA", Path(__file__).resolve().parents[2] / ".." / "shared" / "testdata"))
TEMPLATES = TESTDATA / "chat-templates"
MID = "SmolLM2-135M-Instruct.Q4_1"
QWEN = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
LLAMA = TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"
MISTRAL = TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja"
HERMES = TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def need(path):
    if not path.exists():
        pytest.skip("%s absent (../shared/testdata)" % path)
    return str(path)


def scripted(template, *extra):
    return Server("--chat-template", need(template), *extra, ctx=2048, binary=SCRIPTED_BIN)


def say(text):
    return {"dspark_test_output": text}


# ---- parsing per family, on recorded outputs (well-formed and malformed) ------------------------

CASES = {
    # family template: [(model output, expected calls [(name, args)] or None, expected content)]
    "hermes": (QWEN, [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [("get_weather", {"city": "Paris"})], None),
        ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>',
         [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Paris"})], "Let me look.\n"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par</tool_call>', None,
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par</tool_call>'),
        ('<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>', None, '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>'),
        ('It is sunny, I think.', None, 'It is sunny, I think.'),
    ]),
    "llama3": (LLAMA, [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})], None),
        ('<|python_tag|>{"name": "get_time", "parameters": {"city": "Oslo"}}', [("get_time", {"city": "Oslo"})], None),
        ('{"name": "get_weather", "parameters": {"city": ', None, '{"name": "get_weather", "parameters": {"city": '),
        ('{"temperature": 21}', None, '{"temperature": 21}'),
        ('Paris is sunny.', None, 'Paris is sunny.'),
    ]),
    "mistral": (MISTRAL, [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]', [("get_weather", {"city": "Paris"})], None),
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"city": "Rome"}}]',
         [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Rome"})], None),
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"', None, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"'),
        ('[TOOL_CALLS]not json', None, '[TOOL_CALLS]not json'),
    ]),
}


GENERIC_TEMPLATE = """{% if tools %}<|im_start|>system
You can call these functions; answer with JSON {"name": ..., "arguments": ...}:
{{ tools | tojson }}<|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CASES["generic"] = (None, [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})], None),
    ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": "{\\"city\\": \\"Oslo\\"}"}]',
     [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Oslo"})], None),
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', [("get_time", {})], None),
    ('{"name": "get_weather", "arguments": {"city": "Paris"', None, '{"name": "get_weather", "arguments": {"city": "Paris"'),
    ('[1, 2, 3]', None, '[1, 2, 3]'),
    ('Sunny.', None, 'Sunny.'),
])


@pytest.mark.parametrize("family", sorted(CASES))
def test_parse_recorded_outputs(family, tmp_path):
    template, cases = CASES[family]
    if template is None:  # a template that reads `tools` in no known family's syntax
        template = tmp_path / "generic.jinja"
        template.write_text(GENERIC_TEMPLATE)
    s = scripted(template)
    try:
        assert "tool calls: %s" % family in s.log()
        c = s.client()
        for text, calls, content in cases:
            for stream in (False, True):
                if stream:
                    chunks = list(c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, stream=True, extra_body=say(text)))
                    got_content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
                    parts = {}
                    for ch in chunks:
                        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                            p = parts.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                            p["id"] += tc.id or ""
                            p["name"] += tc.function.name or "" if tc.function else ""
                            p["args"] += tc.function.arguments or "" if tc.function else ""
                    got_calls = [(p["name"], json.loads(p["args"]), p["id"]) for _, p in sorted(parts.items())]
                    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason][-1]
                else:
                    r = c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, extra_body=say(text))
                    m = r.choices[0].message
                    got_content = m.content
                    got_calls = [(t.function.name, json.loads(t.function.arguments), t.id) for t in (m.tool_calls or [])]
                    finish = r.choices[0].finish_reason
                if calls:
                    assert [(n, a) for n, a, _ in got_calls] == calls, (family, text, stream, got_calls)
                    ids = [i for _, _, i in got_calls]
                    assert len(set(ids)) == len(ids) and all(ids), ids
                    if family == "mistral":  # the template insists on 9 alphanumerics
                        assert all(len(i) == 9 and i.isalnum() for i in ids), ids
                    assert finish == "tool_calls"
                    assert (got_content or None) == content
                else:
                    assert got_calls == [] and got_content == content and finish == "stop", (family, text, stream, got_content)
    finally:
        s.close()


# ---- round trips with the openai client ------------------------------------------------------------

def jinja2_prompt_tokens(template_path, messages, tools):
    """The oracle: Python jinja2 renders the same template; dspark's tokenizer counts it."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_template import ENV
    ctx = {"messages": messages, "tools": tools, "add_generation_prompt": True, "enable_thinking": True,
           "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    text = ENV.from_string(Path(template_path).read_text()).render(**ctx)
    ids = json.loads(subprocess.run([BIN, "tokenize", "-m", MODEL, "--special", "--no-bos", text], capture_output=True, check=True).stdout)
    return len(ids)


def test_tool_round_trip_openai():
    s = scripted(QWEN)
    try:
        c = s.client()
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
        r = c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, tool_choice="auto", extra_body=say(call))
        tc = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        assert tc.type == "function" and tc.function.name == "get_weather" and tc.id.startswith("call_")
        assert json.loads(tc.function.arguments) == {"city": "Paris", "unit": "C"}
        assert r.usage.prompt_tokens == jinja2_prompt_tokens(QWEN, ASK, TOOLS)
        # the tool's result goes back; the final answer arrives
        history = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": tc.id, "content": '{"temp": 21}'}]
        r2 = c.chat.completions.create(model=MID, messages=history, tools=TOOLS, extra_body=say("It is 21 degrees in Paris."))
        assert r2.choices[0].message.content == "It is 21 degrees in Paris." and r2.choices[0].finish_reason == "stop"
        ref_msgs = ASK + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": tc.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
            {"role": "tool", "tool_call_id": tc.id, "name": "get_weather", "content": '{"temp": 21}'}]
        assert r2.usage.prompt_tokens == jinja2_prompt_tokens(QWEN, ref_msgs, TOOLS)
        # tool_choice none: the model does not see the tools (the prompt is the one without them)
        r3 = c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, tool_choice="none", extra_body=say(call))
        assert r3.choices[0].message.tool_calls is None and r3.usage.prompt_tokens == jinja2_prompt_tokens(QWEN, ASK, None)
        # required / named: the reply is started with the call opener, which the model continues
        r4 = c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, tool_choice="required",
                                       extra_body=say('get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'))
        assert r4.choices[0].message.tool_calls[0].function.name == "get_time"
        r5 = c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       extra_body=say('{"city": "Lima"}}\n</tool_call>'))
        t5 = r5.choices[0].message.tool_calls[0]
        assert t5.function.name == "get_weather" and json.loads(t5.function.arguments) == {"city": "Lima"}
        # parallel_tool_calls false: the first call only
        two = call + "\n" + call.replace("get_weather", "get_time")
        r6 = c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, parallel_tool_calls=False, extra_body=say(two))
        assert [t.function.name for t in r6.choices[0].message.tool_calls] == ["get_weather"]
        # streaming: OpenAI's incremental tool_calls deltas, as the client accumulates them
        with c.chat.completions.stream(model=MID, messages=ASK, tools=TOOLS, extra_body=say(two)) as st:
            final = st.get_final_completion()
        assert [t.function.name for t in final.choices[0].message.tool_calls] == ["get_weather", "get_time"]
        assert final.choices[0].finish_reason == "tool_calls"
        # bad tool definitions: clear 400s naming the field
        for bad, param in (([{"type": "function", "function": {"name": "bad name!"}}], "tools[0].function"),
                           ([{"type": "function"}], "tools[0]"), ([{"type": "function", "function": {"name": "f", "parameters": 3}}], "tools[0].function"),
                           ([{"type": "function", "function": {"name": "f%d" % i}} for i in range(200)], "tools")):
            with pytest.raises(openai.BadRequestError) as ei:
                c.chat.completions.create(model=MID, messages=ASK, tools=bad)
            assert ei.value.body["param"] == param, ei.value.body
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=MID, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
        assert ei.value.body["param"] == "tool_choice"
    finally:
        s.close()


def test_no_tool_support_is_a_clear_400():
    s = Server()  # SmolLM2's own template never reads `tools`
    try:
        with pytest.raises(openai.BadRequestError) as ei:
            s.client().chat.completions.create(model=MID, messages=ASK, tools=TOOLS, max_tokens=2)
        assert ei.value.body["param"] == "tools" and "no tool support" in ei.value.body["message"]
    finally:
        s.close()


THINK_TEMPLATE = """{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""


def test_reasoning_content(tmp_path):
    """<think>...</think> becomes reasoning_content (vLLM/DeepSeek's field), streamed too; a
    request (or --no-thinking) can turn thinking off through the template's enable_thinking."""
    t = tmp_path / "think.jinja"
    t.write_text(THINK_TEMPLATE)
    s = Server("--chat-template", str(t), binary=SCRIPTED_BIN)
    try:
        c = s.client()
        out = "<think>\nThe user wants a greeting.\n</think>\n\nHello there!"
        r = c.chat.completions.create(model=MID, messages=ASK, extra_body=say(out))
        m = r.choices[0].message
        assert m.content == "Hello there!" and m.model_extra["reasoning_content"] == "\nThe user wants a greeting.\n"
        chunks = list(c.chat.completions.create(model=MID, messages=ASK, stream=True, extra_body=say(out)))
        rc = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks if ch.choices)
        ct = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert rc == "\nThe user wants a greeting.\n" and ct == "Hello there!"
        # enable_thinking false: the template closes the think block itself; no reasoning split
        r = c.chat.completions.create(model=MID, messages=ASK, extra_body={**say("Hi!"), "chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].message.content == "Hi!" and "reasoning_content" not in (r.choices[0].message.model_extra or {})
        assert r.usage.prompt_tokens > c.chat.completions.create(model=MID, messages=ASK, extra_body=say("Hi!")).usage.prompt_tokens
    finally:
        s.close()
    s = Server("--chat-template", str(t), "--no-thinking", binary=SCRIPTED_BIN)
    try:
        c = s.client()
        off = c.chat.completions.create(model=MID, messages=ASK, extra_body=say("Hi!")).usage.prompt_tokens
        on = c.chat.completions.create(model=MID, messages=ASK, extra_body={**say("Hi!"), "chat_template_kwargs": {"enable_thinking": True}})
        assert off > on.usage.prompt_tokens
    finally:
        s.close()


def test_malformed_tool_requests():
    s = scripted(QWEN)
    try:
        U = {"role": "user", "content": "hi"}
        cases = [
            ({"messages": [U], "tools": "x"}, "tools"),
            ({"messages": [U], "tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function"),
            ({"messages": [U], "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
            ({"messages": [U], "tool_choice": "required"}, "tool_choice"),
            ({"messages": [U], "tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
            ({"messages": [U, {"role": "assistant", "tool_calls": {"id": "1"}}]}, "messages[1].tool_calls"),
            ({"messages": [U, {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f"}}]}]}, "messages[1].tool_calls"),
            ({"messages": [U, {"role": "tool", "content": "x", "tool_call_id": 5}]}, "messages[1].tool_call_id"),
            ({"messages": [U], "chat_template_kwargs": [1]}, "chat_template_kwargs"),
            ({"messages": [U], "functions": [{"name": "f"}]}, "functions"),
        ]
        for body, param in cases:
            st, _, resp = post(s.port, "/v1/chat/completions", body)
            assert st == 400 and error_of(st, resp)["param"] == param, (body, resp)
        st, _, resp = post(s.port, "/v1/chat/completions", {"messages": [U], "max_tokens": 2, **say("ok")})
        assert st == 200
    finally:
        s.close()
