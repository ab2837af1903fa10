"""Anthropic's Messages API and OpenAI's Responses API through their official clients (`anthropic`,
`openai`), and /metrics through prometheus_client's parser. Plain generation runs the real model
(greedy output compared with `dspark generate`); tool and thinking round trips run the scripted
twin (see test_server_tools.py) with a published template from ../shared/testdata."""
import json
import os
import urllib.request

import pytest

from srvutil import MODEL, SANITIZED, SCRIPTED_BIN, Server, error_of, generate, post, raw
from test_server_tools import ASK, QWEN, THINK_TEMPLATE, need, say

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason=MODEL + " absent (scripts/fetch-models)")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MID = "SmolLM2-135M-Instruct.Q4_1"
SYSTEM = "Be brief."
Q = "What is the capital of France?"
N = 3 if SANITIZED else 8
T0 = {"temperature": 0}  # this anthropic client version no longer takes temperature as an argument


@pytest.fixture(scope="module")
def srv():
    s = Server("--mode", "baseline")
    yield s
    s.close()


@pytest.fixture(scope="module")
def ref():
    return generate("--chat", "--system", SYSTEM, "-p", Q, "-n", str(N))


def aclient(srv, key="none"):
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0, timeout=120)


# ---- Anthropic --------------------------------------------------------------------------------------

def test_messages_create_and_stream(srv, ref):
    c = aclient(srv)
    m = c.messages.create(model=MID, max_tokens=N, system=SYSTEM, messages=[{"role": "user", "content": Q}], extra_body=T0)
    assert m.type == "message" and m.role == "assistant" and m.model == MID and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ref["text"]
    assert m.stop_reason == ("max_tokens" if ref["finish_reason"] == "length" else "end_turn") and m.stop_sequence is None
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == ref["n_prompt"]
    assert m.usage.output_tokens == ref["n_generated"]
    # streaming: Anthropic's event sequence, text deltas that add up to the same text
    with c.messages.stream(model=MID, max_tokens=N, system=[{"type": "text", "text": SYSTEM}], extra_body=T0,
                           messages=[{"role": "user", "content": [{"type": "text", "text": Q}]}]) as st:
        kinds = [ev.type for ev in st]
        final = st.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].text == ref["text"] and final.stop_reason == m.stop_reason
    # count_tokens counts what create would prompt with
    n = c.messages.count_tokens(model=MID, system=SYSTEM, messages=[{"role": "user", "content": Q}])
    assert n.input_tokens == ref["n_prompt"]


def test_messages_multi_turn_and_stop_sequences(srv, ref):
    c = aclient(srv)
    text = ref["text"]
    assert len(text) >= 3, text
    stop = text[len(text) // 2:][:2]
    m = c.messages.create(model=MID, max_tokens=N, system=SYSTEM, stop_sequences=[stop, "zzzz"],
                          messages=[{"role": "user", "content": Q}], extra_body=T0)
    assert m.content[0].text == text[:text.index(stop)] and m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    turns = [{"role": "user", "content": Q}, {"role": "assistant", "content": text}, {"role": "user", "content": "And of Spain?"}]
    m2 = c.messages.create(model=MID, max_tokens=2, messages=turns, extra_body=T0)
    assert m2.content[0].text and m2.usage.output_tokens == 2
    assert c.messages.count_tokens(model=MID, messages=turns).input_tokens > c.messages.count_tokens(model=MID, messages=turns[:1]).input_tokens


def test_messages_errors(srv):
    c = aclient(srv)
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.create(model=MID, max_tokens=2, messages=[{"role": "user", "content": "hello " * 600}])
    body = ei.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: ") and "> 511 maximum" in body["error"]["message"], body
    with pytest.raises(anthropic.NotFoundError) as ei:
        c.messages.create(model="claude-opus-4", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert ei.value.body["error"]["type"] == "not_found_error"
    # malformed: Anthropic's error shape, the field named, the server alive afterwards
    U = {"role": "user", "content": "hi"}
    for body, what in ((b"{bad json", "JSON"), ({"messages": [U]}, "max_tokens"), ({"max_tokens": 2, "messages": []}, "messages"),
                       ({"max_tokens": 2, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
                       ({"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
                       ({"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}, "tool_use"),
                       ({"max_tokens": 2, "messages": [U], "tools": [{"name": "f"}]}, "input_schema"),
                       ({"max_tokens": 2, "messages": [U], "tools": [{"type": "web_search_20250305", "name": "w"}]}, "server tools"),
                       ({"max_tokens": 2, "messages": [U], "tool_choice": {"type": "maybe"}}, "tool_choice"),
                       ({"max_tokens": 2, "messages": [U], "thinking": {"type": "sometimes"}}, "thinking"),
                       ({"max_tokens": 2, "messages": [U], "temperature": 1.5}, "temperature"),
                       ({"max_tokens": 2, "messages": [U], "stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
                       ({"max_tokens": 2, "messages": [U], "tools": [{"name": "f%d" % i, "input_schema": {}} for i in range(300)]}, "tools")):
        st, hdr, resp = post(srv.port, "/v1/messages", body)
        obj = json.loads(resp)
        assert st == 400 and obj["type"] == "error" and obj["error"]["type"] == "invalid_request_error", (body, resp)
        assert what in obj["error"]["message"], (what, obj)
    st, _, resp = post(srv.port, "/v1/messages/count_tokens", {"messages": "x"})
    assert st == 400 and json.loads(resp)["type"] == "error"
    st, _, resp = raw(srv.port, b"GET /v1/messages HTTP/1.1\r\nHost: x\r\n\r\n")
    assert st == 405 and json.loads(resp)["type"] == "error"
    assert c.messages.create(model=MID, max_tokens=1, messages=[U]).content[0].text


def test_api_key_all_routes():
    s = Server("--api-key", "k3y")
    try:
        ok = aclient(s, "k3y").messages.create(model=MID, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        assert ok.usage.output_tokens == 1
        with pytest.raises(anthropic.AuthenticationError) as ei:
            aclient(s, "nope").messages.create(model=MID, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        assert ei.value.body["error"]["type"] == "authentication_error"
        for path in ("/metrics", "/v1/models"):
            st, _, _ = raw(s.port, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            assert st == 401, path
            st, _, _ = raw(s.port, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nx-api-key: k3y\r\n\r\n")
            assert st == 200, path
        st, _, _ = post(s.port, "/v1/responses", {"input": "hi", "max_output_tokens": 1})
        assert st == 401
        st, _, _ = raw(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert st == 200
    finally:
        s.close()


def test_messages_tool_use_and_thinking(tmp_path):
    s = Server("--chat-template", need(QWEN), ctx=2048, binary=SCRIPTED_BIN)
    try:
        c = aclient(s)
        tools = [{"name": "get_weather", "description": "Weather of a city",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        m = c.messages.create(model=MID, max_tokens=100, tools=tools, messages=ASK, extra_body=say(call))
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
        tu = m.content[0]
        assert tu.name == "get_weather" and tu.input == {"city": "Paris"} and tu.id.startswith("toolu_")
        turns = ASK + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "21 C, sunny"}]}]
        m2 = c.messages.create(model=MID, max_tokens=100, tools=tools, messages=turns, extra_body=say("It is 21 C and sunny in Paris."))
        assert m2.content[0].text == "It is 21 C and sunny in Paris." and m2.stop_reason == "end_turn"
        assert m2.usage.input_tokens + (m2.usage.cache_read_input_tokens or 0) > m.usage.input_tokens
        with c.messages.stream(model=MID, max_tokens=100, tools=tools, messages=ASK, extra_body=say("Checking.\n" + call)) as st:
            final = st.get_final_message()
        assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"city": "Paris"}
        # tool_choice any: the reply is started with the call opener
        m3 = c.messages.create(model=MID, max_tokens=100, tools=tools, tool_choice={"type": "any"}, messages=ASK,
                               extra_body=say('get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'))
        assert m3.content[-1].type == "tool_use" and m3.content[-1].input == {"city": "Rome"}
    finally:
        s.close()
    t = tmp_path / "think.jinja"
    t.write_text(THINK_TEMPLATE)
    s = Server("--chat-template", str(t), binary=SCRIPTED_BIN)
    try:
        c = aclient(s)
        out = "<think>Greet back.</think>Hello!"
        m = c.messages.create(model=MID, max_tokens=100, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=say(out))
        assert [b.type for b in m.content] == ["thinking", "text"] and m.content[0].thinking == "Greet back." and m.content[1].text == "Hello!"
        with c.messages.stream(model=MID, max_tokens=100, messages=ASK, extra_body=say(out)) as st:
            final = st.get_final_message()
        assert final.content[0].thinking == "Greet back." and final.content[1].text == "Hello!"
    finally:
        s.close()


# ---- OpenAI Responses --------------------------------------------------------------------------------

def test_responses_create_and_stream(srv, ref):
    c = srv.client()
    r = c.responses.create(model=MID, instructions=SYSTEM, input=Q, temperature=0, max_output_tokens=N)
    assert r.object == "response" and r.id.startswith("resp_") and r.output_text == ref["text"]
    assert r.status == ("incomplete" if ref["finish_reason"] == "length" else "completed")
    assert r.usage.input_tokens == ref["n_prompt"] and r.usage.output_tokens == ref["n_generated"]
    items = [{"role": "system", "content": SYSTEM}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": Q}]}]
    events = list(c.responses.create(model=MID, input=items, temperature=0, max_output_tokens=N, stream=True))
    kinds = [ev.type for ev in events]
    # the spec ends a reply cut by max_output_tokens with response.incomplete, else response.completed
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    assert kinds[-1] == ("response.incomplete" if ref["finish_reason"] == "length" else "response.completed")
    final = events[-1].response
    assert final.output_text == ref["text"] and final.status == r.status
    assert "".join(ev.delta for ev in events if ev.type == "response.output_text.delta") == ref["text"]
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=MID, input="hi", previous_response_id="resp_123")
    assert ei.value.body["param"] == "previous_response_id" and "stores no responses" in ei.value.body["message"]
    for body, param in (({"input": 5}, "input"), ({"input": [{"type": "image"}]}, "input[0]"), ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
                        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"), ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]")):
        st, _, resp = post(srv.port, "/v1/responses", body)
        assert st == 400 and error_of(st, resp)["param"] == param, (body, resp)


def test_responses_function_calls():
    s = Server("--chat-template", need(QWEN), ctx=2048, binary=SCRIPTED_BIN)
    try:
        c = s.client()
        tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        r = c.responses.create(model=MID, input="Weather in Paris?", tools=tools, extra_body=say(call))
        fc = [o for o in r.output if o.type == "function_call"][0]
        assert fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"} and fc.call_id
        items = [{"role": "user", "content": "Weather in Paris?"}, {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
                 {"type": "function_call_output", "call_id": fc.call_id, "output": "21 C"}]
        r2 = c.responses.create(model=MID, input=items, tools=tools, extra_body=say("21 C in Paris."))
        assert r2.output_text == "21 C in Paris."
        with c.responses.stream(model=MID, input="Weather in Paris?", tools=tools, extra_body=say(call)) as st:
            kinds = [ev.type for ev in st]
            final = st.get_final_response()
        assert "response.function_call_arguments.done" in kinds
        assert [o.type for o in final.output] == ["function_call"] and final.output[0].name == "get_weather"
    finally:
        s.close()


# ---- /metrics --------------------------------------------------------------------------------------------

def test_metrics_after_mixed_load(srv):
    prom = pytest.importorskip("prometheus_client.parser")
    c = srv.client()
    c.chat.completions.create(model=MID, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)
    list(c.completions.create(model=MID, prompt="Hello", max_tokens=2, temperature=0, stream=True))
    aclient(srv).messages.create(model=MID, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    post(srv.port, "/v1/chat/completions", b"{bad")
    with urllib.request.urlopen(srv.url + "/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    fams = {f.name: f for f in prom.text_string_to_metric_families(text)}
    req = {(s.labels["endpoint"], s.labels["status"]): s.value for s in fams["dspark_requests"].samples}
    assert req[("chat_completions", "200")] >= 1 and req[("completions", "200")] >= 1 and req[("messages", "200")] >= 1
    assert req[("chat_completions", "400")] >= 1
    assert fams["dspark_completion_tokens"].samples[0].value >= 6
    ttft = fams["dspark_time_to_first_token_seconds"]
    count = [s.value for s in ttft.samples if s.name.endswith("_count")][0]
    inf = [s.value for s in ttft.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"][0]
    assert count >= 3 and inf == count
    for name in ("dspark_inter_token_latency_seconds", "dspark_spec_accepted_length", "dspark_queue_depth", "dspark_spec_rounds",
                 "dspark_connections_open", "dspark_prompt_tokens_cached", "dspark_round_cost_scale"):
        assert name in fams, name
    scales = {s.labels["kind"]: s.value for s in fams["dspark_round_cost_scale"].samples}
    assert set(scales) == {"plain", "lookup", "block"} and all(v > 0 for v in scales.values()), scales
