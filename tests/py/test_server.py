"""`dspark serve` through the official `openai` Python client: every endpoint and request field,
streaming and not; logprobs checked field by field against the OpenAI API reference; greedy
server output == `dspark generate` output (baseline and --mode lookup servers). Generations are
short so that the file stays fast under ASan."""
import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from srvutil import BIN, MODEL, SANITIZED, Server, generate

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason=MODEL + " absent (scripts/fetch-models)")
openai = pytest.importorskip("openai")

Q = "What is the capital of France?"
SYSTEM = "Be brief."  # a short system message keeps the template's default one (and its prefill) out
MSGS = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q}]
PROMPT = "The three primary colors are"
N = 3 if SANITIZED else 10  # the ASan build decodes ~1 token/s
M = 2 if SANITIZED else 4


@pytest.fixture(scope="module")
def srv():
    s = Server("--mode", "baseline", "--alias", "smol", "--alias", "smol-2", "--max-tokens-cap", "1000")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


@pytest.fixture(scope="module")
def ref_chat():
    return generate("--chat", "--system", SYSTEM, "-p", Q, "-n", str(N), "--logprobs", "3")


@pytest.fixture(scope="module")
def ref_comp():
    return generate("-p", PROMPT, "-n", str(N), "--logprobs", "2")


def check_envelope(obj, object_name, prefix):
    assert obj.id.startswith(prefix + "-")
    assert obj.object == object_name
    assert isinstance(obj.created, int) and abs(obj.created - time.time()) < 600
    assert obj.model == "smol"
    assert obj.system_fingerprint.startswith("dspark-")


def check_usage(u, ref):
    assert u.prompt_tokens == ref["n_prompt"]
    assert u.completion_tokens == ref["n_generated"]
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def finish_of(ref):
    return ref["finish_reason"]


# ---- endpoints ---------------------------------------------------------------------------------

def test_health_and_models(srv, client):
    with urllib.request.urlopen(srv.url + "/health") as r:
        h = json.loads(r.read())
        assert r.status == 200 and h["status"] == "ok" and h["requests_running"] == 0 and h["kv_blocks"] > 0
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == ["smol", "smol-2"]
    for m in models.data:
        assert m.object == "model" and m.owned_by == "dspark" and isinstance(m.created, int)
    assert client.models.retrieve("smol-2").id == "smol-2"
    assert client.models.retrieve("SmolLM2-135M-Instruct.Q4_1").object == "model"  # the file name works too
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_greedy_matches_generate(client, ref_chat):
    r = client.chat.completions.create(model="smol", messages=MSGS, temperature=0, max_tokens=N)
    check_envelope(r, "chat.completion", "chatcmpl")
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert c.message.content == ref_chat["text"]
    assert c.finish_reason == finish_of(ref_chat)
    assert c.logprobs is None
    check_usage(r.usage, ref_chat)


def test_chat_stream_matches_generate(client, ref_chat):
    chunks = list(client.chat.completions.create(model="smol", messages=MSGS, temperature=0,
                                                 max_tokens=N, stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    for c in chunks:
        check_envelope(c, "chat.completion.chunk", "chatcmpl")
    assert chunks[0].choices[0].delta.role == "assistant"
    body, usage = chunks[:-1], chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    check_usage(usage.usage, ref_chat)
    assert all(c.usage is None for c in body)
    assert "".join(c.choices[0].delta.content or "" for c in body) == ref_chat["text"]
    assert [c.choices[0].finish_reason for c in body] == [None] * (len(body) - 1) + [finish_of(ref_chat)]
    # without include_usage there is no usage chunk
    chunks = list(client.chat.completions.create(model="smol", messages=MSGS, temperature=0,
                                                 max_tokens=N, stream=True))
    assert chunks[-1].choices[0].finish_reason == finish_of(ref_chat)
    assert all(c.usage is None for c in chunks)


def check_chat_logprobs(content, text, ref, top_n):
    """choices[].logprobs.content per the API reference: token, logprob, bytes, top_logprobs."""
    assert isinstance(content, list) and content
    assert "".join(t.token for t in content) == text
    ref_lp = ref["logprobs"]
    for i, t in enumerate(content):
        assert isinstance(t.token, str)
        assert isinstance(t.logprob, float) and t.logprob <= 0
        assert isinstance(t.bytes, list) and all(isinstance(b, int) and 0 <= b < 256 for b in t.bytes)
        assert bytes(t.bytes).decode("utf-8", errors="replace") == t.token
        assert len(t.top_logprobs) == top_n
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        for a in t.top_logprobs:
            assert isinstance(a.token, str) and a.logprob <= 0 and bytes(a.bytes).decode("utf-8", errors="replace") == a.token
        # greedy: the chosen token is the most likely one
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-6)
        # same numbers as the library reports to `dspark generate --logprobs`
        assert t.logprob == pytest.approx(ref_lp[i]["logprob"], abs=1e-4)
        assert lps == pytest.approx([x["logprob"] for x in ref_lp[i]["top"][:top_n]], abs=1e-4)


def test_chat_logprobs(client, ref_chat):
    msgs = MSGS
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=N, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    assert c.message.content == ref_chat["text"]
    check_chat_logprobs(c.logprobs.content, c.message.content, ref_chat, 3)
    # an end-of-generation token is not part of the text and not in the logprobs
    n_eog = 1 if finish_of(ref_chat) == "stop" else 0
    assert len(c.logprobs.content) == ref_chat["n_generated"] - n_eog
    # logprobs without alternatives
    r0 = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=3, logprobs=True)
    assert all(t.top_logprobs == [] for t in r0.choices[0].logprobs.content)
    # streamed: the same entries, spread over the chunks
    chunks = list(client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=N, logprobs=True,
                                                 top_logprobs=3, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in c.logprobs.content]


def test_completions_greedy_matches_generate(client, ref_comp):
    r = client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N)
    check_envelope(r, "text_completion", "cmpl")
    c = r.choices[0]
    assert c.index == 0 and c.text == ref_comp["text"] and c.finish_reason == finish_of(ref_comp) and c.logprobs is None
    check_usage(r.usage, ref_comp)
    # streamed
    chunks = list(client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N, stream=True,
                                            stream_options={"include_usage": True}))
    for ch in chunks:
        check_envelope(ch, "text_completion", "cmpl")
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == ref_comp["text"]
    assert chunks[-2].choices[0].finish_reason == finish_of(ref_comp)
    check_usage(chunks[-1].usage, ref_comp)
    # the prompt as token ids, and as a one-element list
    ids = json.loads(subprocess.run([BIN, "tokenize", "-m", MODEL, PROMPT], capture_output=True, check=True).stdout)
    assert client.completions.create(model="smol", prompt=ids, temperature=0, max_tokens=N).choices[0].text == ref_comp["text"]
    assert client.completions.create(model="smol", prompt=[PROMPT], temperature=0, max_tokens=N).choices[0].text == ref_comp["text"]


def test_completions_logprobs_and_echo(client, ref_comp):
    r = client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N, logprobs=2)
    c = r.choices[0]
    lp = c.logprobs
    n = len(lp.tokens)
    assert n == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    assert "".join(lp.tokens) == c.text
    for i in range(n):
        assert isinstance(lp.tokens[i], str) and lp.token_logprobs[i] <= 0
        assert lp.token_logprobs[i] == pytest.approx(ref_comp["logprobs"][i]["logprob"], abs=1e-4)
        top = lp.top_logprobs[i]
        assert isinstance(top, dict) and 1 <= len(top) <= 3 and lp.tokens[i] in top  # the 2 most likely + the chosen
        assert max(top.values()) == pytest.approx(lp.token_logprobs[i], abs=1e-6)  # greedy
        assert lp.text_offset[i] == len("".join(lp.tokens[:i]))
    streamed = list(client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N, logprobs=2, stream=True))
    toks = [t for ch in streamed if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    offs = [t for ch in streamed if ch.choices[0].logprobs for t in ch.choices[0].logprobs.text_offset]
    assert toks == lp.tokens and offs == lp.text_offset
    # echo: the prompt comes back in front of the completion
    e = client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N, echo=True)
    assert e.choices[0].text == PROMPT + ref_comp["text"]
    es = list(client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N, echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in es) == PROMPT + ref_comp["text"]


# ---- request fields ------------------------------------------------------------------------------

def test_sampling_fields_match_generate(client):
    """Every sampling field reaches the engine: the same seed and parameters give what
    `dspark generate` gives."""
    args = dict(temperature=0.9, top_p=0.9, seed=1234, presence_penalty=0.5, frequency_penalty=0.25)
    ext = {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1}
    ref = generate("--chat", "--system", SYSTEM, "-p", Q, "-n", str(N), "--temperature", "0.9", "--top-p", "0.9", "--seed", "1234",
                   "--presence-penalty", "0.5", "--frequency-penalty", "0.25", "--top-k", "40", "--min-p", "0.05",
                   "--repeat-penalty", "1.1")
    msgs = MSGS
    r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=N, user="tester", extra_body=ext, **args)
    assert r.choices[0].message.content == ref["text"]
    r2 = client.chat.completions.create(model="smol", messages=msgs, max_tokens=N, extra_body=ext, **args)
    assert r2.choices[0].message.content == ref["text"]  # seeded: reproducible
    # greedy with penalties, completions endpoint
    ref_g = generate("-p", PROMPT, "-n", str(N), "--presence-penalty", "1.5", "--repeat-penalty", "1.3")
    g = client.completions.create(model="smol", prompt=PROMPT, max_tokens=N, temperature=0, presence_penalty=1.5,
                                  extra_body={"repetition_penalty": 1.3})
    assert g.choices[0].text == ref_g["text"]


def test_stop_and_lengths(client, ref_chat):
    text = ref_chat["text"]
    msgs = MSGS
    assert len(text) >= 3, text
    stop = text[len(text) // 2:][:2]
    cut = text[:text.index(stop)]
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=N, stop=stop)
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=N, stop=["zzzz", stop, "", "qq"])
    assert r.choices[0].message.content == cut
    r = client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=N, stop=["\n\n\n\n"])
    assert r.choices[0].finish_reason in ("stop", "length")
    # max_completion_tokens (newer name) wins over max_tokens
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_completion_tokens=3, max_tokens=N)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    # ignore_eos (extension): exactly max_tokens tokens
    r = client.completions.create(model="smol", prompt=PROMPT, temperature=0, max_tokens=4, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4


def test_logit_bias(client, ref_chat):
    first = ref_chat["token_ids"][0]
    msgs = MSGS
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=2, logit_bias={str(first): -100},
                                       logprobs=True)
    assert not ref_chat["text"].startswith(r.choices[0].logprobs.content[0].token)
    forced = 17  # any ordinary token: +100 makes it certain
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=1, logit_bias={str(forced): 100})
    want = subprocess.run([BIN, "detokenize", "-m", MODEL, str(forced)], capture_output=True, check=True).stdout.decode()[:-1]
    assert r.choices[0].message.content == want


def test_messages_forms_and_kv_reuse(client):
    sys_msg = {"role": "system", "content": SYSTEM}
    parts = {"role": "user", "content": [{"type": "text", "text": "Name a color."}, {"type": "text", "text": "One word."}]}
    r1 = client.chat.completions.create(model="smol", messages=[sys_msg, parts], temperature=0, max_tokens=M)
    a = r1.choices[0].message.content
    # developer is OpenAI's newer name for system
    r1b = client.chat.completions.create(model="smol", messages=[{"role": "developer", "content": SYSTEM}, parts],
                                         temperature=0, max_tokens=M)
    assert r1b.choices[0].message.content == a
    # a follow-up turn reuses the first turn's KV
    turn2 = [sys_msg, parts, {"role": "assistant", "content": a}, {"role": "user", "content": "Another one."}]
    r2 = client.chat.completions.create(model="smol", messages=turn2, temperature=0, max_tokens=M)
    # (whole 16-token KV blocks of what the first turn fed are cached)
    assert r2.usage.prompt_tokens_details.cached_tokens >= (r1.usage.prompt_tokens - 1) // 16 * 16 > 0


def test_rejected_fields(srv, client):
    msgs = MSGS
    cases = [
        (dict(n=2), "n"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(max_tokens=1001), "max_tokens"),
        (dict(max_completion_tokens=0), "max_completion_tokens"),
        (dict(temperature=2.5), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        (dict(presence_penalty=-3), "presence_penalty"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
        (dict(logit_bias={"999999999": 1}), "logit_bias"),
        (dict(logit_bias={"5": 101}), "logit_bias"),
        (dict(response_format={"type": "json_object"}), "response_format"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="smol", messages=msgs, **{"max_tokens": 2, **kw})
        err = ei.value.body
        assert ei.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error", (kw, err)
        assert param in err["message"], err
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    assert ei.value.body["code"] == "model_not_found" and ei.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="smol", prompt=PROMPT, max_tokens=2, logprobs=1, echo=True)
    assert ei.value.body["param"] == "echo"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="smol", prompt=[PROMPT, PROMPT], max_tokens=2)
    assert ei.value.body["param"] == "prompt"
    # a prompt longer than the context (512 tokens here)
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="smol", prompt="hello " * 600, max_tokens=2)
    assert ei.value.body["code"] == "context_length_exceeded" and "512" in ei.value.body["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hello " * 600}], max_tokens=2)
    assert ei.value.body["code"] == "context_length_exceeded" and ei.value.body["param"] == "messages"
    # still serving
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=2)
    assert r.choices[0].message.content


def test_api_key():
    s = Server("--api-key", "sekrit-key")
    try:
        with pytest.raises(openai.AuthenticationError) as ei:
            s.client(api_key="wrong").models.list()
        assert ei.value.status_code == 401 and ei.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="sekrit-ke").chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        c = s.client(api_key="sekrit-key")
        assert c.models.list().data[0].id == "SmolLM2-135M-Instruct.Q4_1"
        r = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Hi", temperature=0, max_tokens=1)
        assert r.choices[0].text
        with urllib.request.urlopen(s.url + "/health") as h:  # health needs no key
            assert h.status == 200
    finally:
        s.close()


LOOKUP_Q = "Repeat this line three times: one two three four five six seven eight."
LOOKUP_P = "one two three four five, one two three four five, one two three four five, one two"  # drafts at once


@pytest.mark.parametrize("mode", ["default", "lookup"])
def test_greedy_equal_to_baseline(mode):
    """Speculative decoding is lossless: greedy output of a speculating server (its default mode,
    and --mode lookup) is byte-identical to `dspark generate --mode baseline`, which never drafts.
    The server's log must show drafts were verified, or the comparison would prove nothing."""
    n = 4 if SANITIZED else 24
    ref_p = generate("--mode", "baseline", "-p", LOOKUP_P, "-n", str(n))
    ref_c = None if SANITIZED else generate("--mode", "baseline", "--chat", "--system", SYSTEM, "-p", LOOKUP_Q, "-n", str(n))
    s = Server(*([] if mode == "default" else ["--mode", mode]), "--max-draft", "4")
    try:
        c = s.client()
        model = c.models.list().data[0].id
        chunks = list(c.completions.create(model=model, prompt=LOOKUP_P, temperature=0, max_tokens=n, stream=True))
        assert "".join(ch.choices[0].text for ch in chunks) == ref_p["text"]
        r = c.completions.create(model=model, prompt=LOOKUP_P, temperature=0, max_tokens=n)
        assert r.choices[0].text == ref_p["text"] and r.usage.completion_tokens == ref_p["n_generated"]
        if ref_c:  # the chat path too (skipped under ASan: one more long prefill)
            r = c.chat.completions.create(model=model, messages=[{"role": "system", "content": SYSTEM},
                                                                 {"role": "user", "content": LOOKUP_Q}],
                                          temperature=0, max_tokens=n)
            assert r.choices[0].message.content == ref_c["text"]
            assert r.usage.completion_tokens == ref_c["n_generated"]
        drafted = [int(m) for m in re.findall(r"accepted \d+/(\d+) drafted", s.log())]
        assert drafted and max(drafted) > 0, s.log()[-3000:]
    finally:
        s.close()
